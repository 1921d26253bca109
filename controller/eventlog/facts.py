"""What each event of the controller's log says: one frozen dataclass per kind, its fields the event's data.

As the trainer's events are (:mod:`worker_agent.contract.events`), so are the controller's own: a decision
says ``draft.event(CollectiveFailed(generation=3, rank=1, ...), job, node)`` and mypy checks the fields,
where a ``**data`` of any keys would store a misspelt one silently. :meth:`Fact.data` is what the event log
keeps (a field left ``None`` where the class marks it optional is left out), and the readers decode the same
classes (:func:`controller.eventlog.schema.decode`). The providers' events are
:mod:`controller.eventlog.provider_facts`; the store builds the state changes', submissions' and generations'
facts from the typed commands it writes (a ``Transition``, an ``AddJob``, a ``StartGeneration``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.eventlog.fact import Fact
from controller.eventlog.kinds import EventKind


@dataclass(frozen=True)
class NodeRegistered(Fact):
    kind = EventKind.NODE_REGISTERED
    incarnation: int
    slots: int
    address: str
    gpus: list[dict[str, Any]] = field(default_factory=list)  # none in events older than nodes' GPUs: a CPU node


@dataclass(frozen=True)
class NodeQuarantined(Fact):
    """A node back soon after it was LOST (a flap) waits in JOINING, beating, until ``until`` before it gets work
    (controller.core.flapping); ``lost_at`` is when the incarnation before was LOST."""

    kind = EventKind.NODE_QUARANTINED
    flaps: int
    lost_at: float | None
    quarantine_seconds: float
    until: float
    message: str


@dataclass(frozen=True)
class CheckpointCommitted(Fact):
    kind = EventKind.CHECKPOINT_COMMITTED
    generation: int
    step: int


@dataclass(frozen=True)
class HeldStateSkipped(Fact):
    """A generation resumed from the committed checkpoint, not the step it was named in memory: why, and its
    class (``cause``, a :class:`morphing.transfer.HeldSkipCause`; left out when an older agent names none)."""

    kind = EventKind.HELD_STATE_SKIPPED
    optional = frozenset({"cause"})
    generation: int
    held_step: int
    resume_step: int
    reason: str
    cause: str | None = None


@dataclass(frozen=True)
class HandOffFailed(Fact):
    """At a generation's stop for an eviction, the layers its leaving ranks handed to staying ones did not all
    arrive intact (``reason``, a rank's words): every rank wrote ``step`` to the disk instead, so none is lost."""

    kind = EventKind.HAND_OFF_FAILED
    generation: int
    step: int
    reason: str


@dataclass(frozen=True)
class TrainingProgressed(Fact):
    kind = EventKind.TRAINING_PROGRESSED
    generation: int
    step: int
    loss: float | None
    samples_per_second: float | None


@dataclass(frozen=True)
class EvaluationCompleted(Fact):
    kind = EventKind.EVALUATION_COMPLETED
    generation: int
    step: int
    loss: float


@dataclass(frozen=True)
class CheckpointStallMeasured(Fact):
    kind = EventKind.CHECKPOINT_STALL_MEASURED
    generation: int
    step: int
    stall_seconds: float


@dataclass(frozen=True)
class TrainingResumed(Fact):
    kind = EventKind.TRAINING_RESUMED
    generation: int
    step: int
    pause_seconds: float
    decision_seconds: float | None
    paused_since: float
    resumed_at: float
    stalled_seconds: float | None = None  # of the pause, until g+1's ranks began their first step (None: unsaid)


@dataclass(frozen=True)
class EvictionNoticed(Fact):
    kind = EventKind.EVICTION_NOTICED
    not_before: float | None


@dataclass(frozen=True)
class EvictionWithdrawn(Fact):
    kind = EventKind.EVICTION_WITHDRAWN
    not_before: float | None


@dataclass(frozen=True)
class EvictionRiskNoticed(Fact):
    """The cloud warned that the node may be evicted soon, before any notice (``source``: which warning;
    ``noticed_at``: the node's clock when its agent first saw it): it gets no new work from now on, and its job
    moves off it where spare nodes keep its throughput. Recorded once per episode."""

    kind = EventKind.EVICTION_RISK_NOTICED
    source: str
    noticed_at: float


@dataclass(frozen=True)
class EvictionRiskWithdrawn(Fact):
    """The node's heartbeats stopped carrying the warning ``EvictionRiskNoticed`` recorded; a morph it began
    goes on."""

    kind = EventKind.EVICTION_RISK_WITHDRAWN
    source: str
    noticed_at: float


@dataclass(frozen=True)
class TrainerStartFailed(Fact):
    kind = EventKind.TRAINER_START_FAILED
    generation: int
    error: str


@dataclass(frozen=True)
class NodeImplicated(Fact):
    kind = EventKind.NODE_IMPLICATED
    generation: int
    partners: list[str]
    until: float


@dataclass(frozen=True)
class CollectiveFailed(Fact):
    kind = EventKind.COLLECTIVE_FAILED
    generation: int
    rank: int
    stage: int
    replica: int
    step: int | None  # the last completed step it holds


@dataclass(frozen=True)
class NodesSuspected(Fact):
    kind = EventKind.NODES_SUSPECTED
    generation: int
    nodes: list[str]


@dataclass(frozen=True)
class SalvageOrdered(Fact):
    kind = EventKind.SALVAGE_ORDERED
    generation: int
    step: int
    writers: list[int]


@dataclass(frozen=True)
class SalvageEnded(Fact):
    """How a salvage ended (``reason``, a :class:`controller.core.causes.SalvageOutcome`) and what it names."""

    kind = EventKind.SALVAGE_ENDED
    optional = frozenset(
        {"step", "holders", "writers_failed", "nodes_gone", "stages_lost", "resume_step", "source", "steps_lost"}
    )
    generation: int
    reason: str
    step: int | None = None  # the step salvaged (None: no step every stage holds)
    holders: list[int] | None = None  # the step stays in these ranks' memory
    writers_failed: list[int] | None = None
    nodes_gone: list[str] | None = None
    stages_lost: list[int] | None = None  # no survivor holds these stages
    resume_step: int | None = None  # it fell back: the next generation resumes from this committed step
    source: str | None = None  # where the step comes from: a morphing.snapshots.RecoverySource value
    steps_lost: int | None = None  # the newest step a rank completed, less the step resumed from


@dataclass(frozen=True)
class GrowthDeclined(Fact):
    kind = EventKind.GROWTH_DECLINED
    generation: int
    free_nodes: list[str]
    reason: str
    detail: str
    samples_per_second: float | None
    candidate_samples_per_second: float | None
    remaining_seconds: float | None
    morph_cost_seconds: float


@dataclass(frozen=True)
class ReportRefused(Fact):
    kind = EventKind.REPORT_REFUSED
    why: str


@dataclass(frozen=True)
class DecisionsResumed(Fact):
    kind = EventKind.DECISIONS_RESUMED


@dataclass(frozen=True)
class LeaderElected(Fact):
    """A controller took the lease (at start, or from a leader that died or stopped): ``epoch`` fences every write
    of its, ``address`` is where agents and clients reach it, ``previous`` the address the lease named before
    ('' at the first)."""

    kind = EventKind.LEADER_ELECTED
    epoch: int
    address: str
    previous: str


@dataclass(frozen=True)
class InvariantViolated(Fact):
    """A decided world broke invariants (controller.core.invariants, under ``--validate``): a bug, so the decision
    was not committed. ``invariants`` names them, ``detail`` says how (one sentence each)."""

    kind = EventKind.INVARIANT_VIOLATED
    invariants: list[str]
    detail: str


# The store's own: it builds these from the typed commands it writes.


@dataclass(frozen=True)
class JobSubmitted(Fact):
    kind = EventKind.JOB_SUBMITTED
    name: str  # the spec's


@dataclass(frozen=True)
class StateChanged(Fact):
    """One edge of a state machine: ``source -> target`` (``from`` and ``to`` in the data), the cause its table
    gives the edge, and why it was taken (:class:`controller.core.lifecycle.Transition`)."""

    renamed = (("source", "from"), ("target", "to"))
    source: str
    target: str
    cause: str
    reason: str


@dataclass(frozen=True)
class NodeStateChanged(StateChanged):
    kind = EventKind.NODE_STATE_CHANGED


@dataclass(frozen=True)
class JobActionChanged(StateChanged):
    """What a morphing job's trainers are told changed (RUN, STOP, ABORT, HOLD), on its own."""

    kind = EventKind.JOB_ACTION_CHANGED


@dataclass(frozen=True)
class JobStateChanged(StateChanged):
    """A job's state changed, and its action with it when the move changed that too (``action``)."""

    kind = EventKind.JOB_STATE_CHANGED
    optional = frozenset({"action"})
    action: JobActionChanged | None = None


@dataclass(frozen=True)
class GenerationIssued(Fact):
    """A generation of a job was issued: its layout in words, the checkpoint it loads (``resume_step`` of
    ``resume_generation``), the step it takes from its predecessor's memory instead (``held_step`` of
    ``held_generation``; 0: none), and why (``cause`` in words, ``morph_cause`` a ``MorphCause`` value).
    Events older than a field read its default (written before generations named them)."""

    kind = EventKind.GENERATION_ISSUED
    generation: int
    layout: str
    resume_step: int
    cause: str
    resume_generation: int = 0
    held_step: int = 0
    held_generation: int = 0
    morph_cause: str = ""  # "": written before causes were labelled

    @property
    def resumed_at_step(self) -> int:
        """The step it started from: the memory it took, or its checkpoint (as ``JobRecord.resumed_at_step``)."""
        return max(self.resume_step, self.held_step)
