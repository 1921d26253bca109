"""Every kind of event the controller's log holds: past-tense facts, one vocabulary for the daemon and its readers."""

from __future__ import annotations

from enum import StrEnum


class EventKind(StrEnum):
    JOB_SUBMITTED = "JobSubmitted"
    JOB_STATE_CHANGED = "JobStateChanged"  # with its action's change when the move changed that too
    JOB_ACTION_CHANGED = "JobActionChanged"  # what a morphing job's trainers are told, changed on its own
    NODE_REGISTERED = "NodeRegistered"
    NODE_STATE_CHANGED = "NodeStateChanged"
    NODE_QUARANTINED = "NodeQuarantined"  # came back soon after being LOST: waits in JOINING before it gets work
    GENERATION_ISSUED = "GenerationIssued"
    CHECKPOINT_COMMITTED = "CheckpointCommitted"
    HELD_STATE_SKIPPED = "HeldStateSkipped"  # a generation resumed from the disk, not the memory it was named
    HAND_OFF_FAILED = "HandOffFailed"  # a stop for an eviction wrote its step: the layers handed over were damaged
    EVALUATION_COMPLETED = "EvaluationCompleted"  # a generation's trainers reported a new eval loss
    TRAINING_PROGRESSED = "TrainingProgressed"  # the newest step's loss and samples/s, at most once a period
    CHECKPOINT_STALL_MEASURED = "CheckpointStallMeasured"  # how long a checkpoint paused training (its slowest rank)
    TRAINING_RESUMED = "TrainingResumed"  # a new generation's first step: the pause its morph caused
    EVICTION_NOTICED = "EvictionNoticed"
    EVICTION_WITHDRAWN = "EvictionWithdrawn"
    EVICTION_RISK_NOTICED = "EvictionRiskNoticed"  # the cloud warned a node may be evicted soon (once an episode)
    EVICTION_RISK_WITHDRAWN = "EvictionRiskWithdrawn"  # its agent's heartbeats stopped carrying that warning
    TRAINER_START_FAILED = "TrainerStartFailed"
    NODE_IMPLICATED = "NodeImplicated"  # its peers could not reach it, start after start: left out of the job a while
    COLLECTIVE_FAILED = "CollectiveFailed"  # the first survivor's report of an unplanned loss
    NODES_SUSPECTED = "NodesSuspected"  # not heard from within the grace after it: left out of the next generation
    SALVAGE_ORDERED = "SalvageOrdered"  # writers chosen for the just-in-time checkpoint
    SALVAGE_ENDED = "SalvageEnded"  # committed, or why the job falls back to its newest periodic checkpoint
    GROWTH_DECLINED = "GrowthDeclined"
    # the scheduler (controller.core.reconcile.on_demand, .learn): on-demand capacity and the planner that learns
    ON_DEMAND_REQUESTED = "OnDemandRequested"  # a job's deadline is at risk on spot alone: on-demand GPUs for it
    ON_DEMAND_RELEASED = "OnDemandReleased"  # its on-demand nodes given back (spot returned, the job ended)
    STEP_TIME_CHECKED = "StepTimeChecked"  # a generation's measured step time against the planner's prediction
    GROWTH_UNDONE = "GrowthUndone"  # a growth made the job slower: undone, and those nodes not tried again
    JOB_SHRUNK = "JobShrunk"  # spot GPUs moved from the job to another worth more (priority) or starving (sharing)
    REPORT_REFUSED = "ReportRefused"  # deciding on a node's report failed; it was set aside
    DECISIONS_RESUMED = "DecisionsResumed"  # the first decision after decisions had failed
    LEADER_ELECTED = "LeaderElected"  # a controller took the lease: the first decision of its epoch
    INVARIANT_VIOLATED = "InvariantViolated"  # --validate refused a decided world (a bug): it was not committed
    # any provider: what the controller asked of it and what came of it
    CAPACITY_REQUESTED = "CapacityRequested"
    PROVIDER_CAPACITY_REQUEST_FAILED = "ProviderCapacityRequestFailed"
    PROVIDER_RELEASE_FAILED = "ProviderReleaseFailed"
    # the local process provider
    LOCAL_VMS_STARTED = "LocalVmsStarted"
    # a scale-set provider (Azure's; data names the provider's own words): what it did
    PROVIDER_SCALE_OUT = "ProviderScaleOut"
    PROVIDER_SCALE_OUT_DONE = "ProviderScaleOutDone"
    PROVIDER_DELETE_INSTANCES = "ProviderDeleteInstances"
    # ... and what it could not do
    PROVIDER_SCALE_IN_DEFERRED = "ProviderScaleInDeferred"
    PROVIDER_CAPACITY_LIMITED = "ProviderCapacityLimited"
    PROVIDER_RELEASE_REFUSED = "ProviderReleaseRefused"
    PROVIDER_AGENT_TOKEN_DELIVERED = "ProviderAgentTokenDelivered"
    PROVIDER_AGENT_TOKEN_FAILED = "ProviderAgentTokenFailed"
    PROVIDER_THROTTLED = "ProviderThrottled"
    PROVIDER_CAPACITY_UNAVAILABLE = "ProviderCapacityUnavailable"
    PROVIDER_CONFLICT = "ProviderConflict"
    PROVIDER_NOT_FOUND = "ProviderNotFound"
    PROVIDER_AUTH_FAILED = "ProviderAuthFailed"
    PROVIDER_UNREACHABLE = "ProviderUnreachable"
    PROVIDER_ERROR = "ProviderError"
