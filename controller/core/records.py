"""Records the store keeps (nodes, jobs) and the assignment a node's heartbeat is answered with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import Action, JobState, NodeState
from controller.core.observations import EvictionRisk
from morphing.jobspec import JobSpec
from morphing.layout import Layout
from scheduler.deadlines import CapacityCause
from scheduler.pools import PoolKind

__all__ = ["Action"]  # its lifecycle (ACTION_TRANSITIONS) lives beside the states'


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node as its agent reported it at registration."""

    index: int  # the CUDA device index its trainers use
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class AtRisk:
    """A node's eviction risk episode, from the first heartbeat that carried the warning to the first without it:
    recorded once (``EvictionRiskNoticed``), so decisions and the event log see one risk, not one per beat."""

    risk: EvictionRisk  # as its agent first reported it
    since: float  # the controller's clock when the episode was recorded
    moved_at: float | None = None  # when a job was moved off it for this risk: never twice (reconcile.risk)


@dataclass(frozen=True)
class NodeRecord:
    name: str
    incarnation: int
    state: NodeState
    slots: int
    address: str
    joined_at: float
    state_since: float
    job: str | None = None
    eviction_not_before: float | None = None
    gpus: tuple[Gpu, ...] = ()  # empty: a CPU node (or one registered before nodes reported GPUs)
    instance: str = ""  # what registered it (instance id or address, certificate); "" in records older than that
    lost_at: float | None = None  # when this incarnation was declared LOST
    flaps: int = 0  # times the name came back soon after being LOST (controller.core.flapping)
    flapped_at: float | None = None  # when the incarnation before this one was LOST, if that was a flap
    quarantined_until: float | None = None  # a JOINING node that flapped gets no work before this (flapping)
    # A job's collective failed and this node was silent through the grace, at this time: no job gets work on it
    # until it is heard from after that (most such nodes are dead and go LOST at the heartbeat expiry).
    suspected_at: float | None = None
    # When another VM (instance) took this name, or the name first registered: the ranks of generations issued
    # before it were run by another machine, whose logs this incarnation may not send (controller/persistence/logs).
    name_taken_at: float | None = None
    at_risk: AtRisk | None = None  # the cloud warned it may be evicted soon: no new work; its job may move off
    pool: PoolKind = PoolKind.SPOT  # as the provider lists it (a node no list has named yet counts as spot)
    # The job an on-demand node was asked for, and the only one it serves; None on an on-demand node: given back
    # (or wanted by none when it came), so no job gets it and it is released once free (reconcile.on_demand).
    owner: str | None = None


@dataclass(frozen=True)
class CheckpointRef:
    """A step and the generation that has it: a committed checkpoint's directory (``step-NNNNNNNN-gG``), or the
    step a generation keeps in memory. Step 0 is none (from scratch; nothing held)."""

    step: int = 0
    generation: int = 0


@dataclass(frozen=True)
class Training:
    """What a job's trainers last said of their training: the newest step's loss and rate."""

    loss: float | None = None  # the global-batch loss of ``step`` (None: none reported yet)
    step: int = 0
    samples_per_second: float | None = None
    reported_at: float | None = None  # when the last TrainingProgressed event was recorded (its rate bound)
    generation: int = 0  # the generation that reported it


@dataclass(frozen=True)
class Evaluation:
    """The newest evaluation the trainers reported: its mean loss over the eval dataset (the same in every layout)."""

    step: int = 0  # 0: none yet
    loss: float | None = None


@dataclass(frozen=True)
class CheckpointStall:
    """The newest checkpoint's stall: how long training paused for it (its slowest rank), its step and generation."""

    seconds: float | None = None  # None: no checkpoint reported yet
    step: int = 0
    generation: int = 0


@dataclass(frozen=True)
class Morph:
    """The current (or last) morph: when and why it began, and what the pause it causes has cost so far."""

    started_at: float | None = None  # None once the generation it led to is running
    cause: MorphCause | None = None
    detail: str = ""  # the cause in words, naming nodes and figures
    paused_since: float | None = None  # while the generation's first step is awaited: the last step before the pause
    decision_seconds: float | None = None  # how long the controller took to issue the current generation
    # A shrink's: the nodes its next generation is planned on (None: those it keeps and free ones; reconcile.sharing)
    keep_only: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Exclusions:
    """Nodes this job's trainers could not start on, or whose peers could not reach them (reconcile.unreachable)."""

    nodes: tuple[str, ...] = ()  # left out of every layout of the job
    rendezvous_failures: tuple[tuple[str, str, float], ...] = ()  # (node, rendezvous host it could not reach, when)
    until: tuple[tuple[str, float], ...] = ()  # left out until then


@dataclass(frozen=True)
class Salvage:
    """The salvage of an unplanned loss (action HOLD: the survivors hold their last completed step in memory): the
    nodes not heard from since the failure, the step salvaged and the just-in-time checkpoint ordered of it."""

    suspected: tuple[str, ...] = ()
    step: int = 0  # the step salvaged: kept in memory for g+1, or written by the writers (0: none chosen yet)
    writers: tuple[int, ...] = ()  # one rank per stage, in stage order
    deadline: float = 0.0  # nothing is written after it; the controller falls back then


@dataclass(frozen=True)
class OnDemandHold:
    """The on-demand GPUs the scheduler wants a job to hold, why (a ``CapacityCause``), and the numbers behind it
    (what ``spotmorph status`` shows): its deadline, work left, and its expected speed on spot alone."""

    gpus: int = 0
    cause: CapacityCause | None = None
    since: float | None = None  # when the level last changed
    deadline_in_seconds: float | None = None
    remaining_samples: float = 0.0
    spot_gpus: int = 0
    spot_samples_per_second: float = 0.0  # its liveput on spot alone
    with_on_demand_samples_per_second: float = 0.0
    finish_seconds: float | None = None  # its work left on spot alone at that rate (None: spot alone never does)
    returned_gpu_seconds: float = 0.0  # on-demand GPU-seconds of the nodes it gave back, from each one's join


@dataclass(frozen=True)
class Learning:
    """The planner that learns (``scheduler.learning``): this job's measured step times against the predictions,
    the last check's errors before and after the correction, and the growths undone."""

    observations: tuple[tuple[int, float, float], ...] = ()  # (gpus, predicted, measured step seconds), newest last
    checked_generation: int = 0  # the newest generation whose step time was checked
    error_before: float | None = None  # |predicted - measured| / measured at that check
    error_after: float | None = None  # ... with the correction learned from the checks before it
    growth_from: float | None = None  # samples/s measured when the current generation's growth was decided
    grown_from: tuple[str, ...] = ()  # the nodes it ran on before that growth
    avoid: tuple[tuple[str, ...], ...] = ()  # node sets whose growth made it slower: never grown onto again


@dataclass(frozen=True)
class JobRecord:
    id: str
    spec: JobSpec
    state: JobState
    submitted_at: float
    state_since: float
    generation: int = 0  # newest generation issued; the fencing token
    layout: Layout | None = None  # layout of ``generation``
    action: Action = Action.RUN
    rendezvous: str = ""
    resume: CheckpointRef = CheckpointRef()  # the checkpoint ``generation`` started from (step 0: from scratch)
    held: CheckpointRef = CheckpointRef()  # the step the previous generation stopped at and keeps in memory
    step: int = 0  # newest step any rank of the job finished
    last_checkpoint: CheckpointRef = CheckpointRef()  # the newest committed checkpoint
    steps_lost: int = 0
    restarts: int = 0
    checkpoint_request: int = 0  # bumped to ask for a checkpoint at the next step boundary
    reason: str = ""
    failure_cause: JobFailureCause | None = None  # set on entering FAILED; ``reason`` holds the words
    growth_declined: str = ""  # the (generation, free nodes) whose growth was last declined: said once
    idempotency_key: str | None = None  # the key its SubmitJob carried: a retry with it gets this job back
    last_step_at: float | None = None  # trainers' wall clock when the newest step reported was completed
    morph: Morph = Morph()
    exclusions: Exclusions = Exclusions()
    salvage: Salvage = Salvage()
    training: Training = Training()
    evaluation: Evaluation = Evaluation()
    checkpoint_stall: CheckpointStall = CheckpointStall()
    on_demand: OnDemandHold = OnDemandHold()
    learning: Learning = Learning()
    # What the scheduler's aging and starvation count (a move stamps them, controller.core.changes; None: as
    # state_since, for rows older than them): when it last began waiting with no GPUs (kept while it stays queued,
    # whatever it waits for), and when it last got GPUs after having none (kept across its morphs).
    queued_since: float | None = None
    running_since: float | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.layout.nodes() if self.layout else ()

    @property
    def resumed_at_step(self) -> int:
        """The step ``generation`` started from: the memory it took, or its checkpoint (one definition for status,
        the dashboard, TensorBoard and metrics; ``GenerationRow.resumed_at_step`` is the same for past ones)."""
        return max(self.resume.step, self.held.step)


class JobFields(TypedDict, total=False):
    """The keywords ``act`` and ``amend`` take for a job: its fields but the ones that name it and the ones only
    a move or an act writes (state, state_since, reason, action). tests/controller/test_changes.py checks they agree."""

    generation: int
    layout: Layout | None
    rendezvous: str
    resume: CheckpointRef
    held: CheckpointRef
    step: int
    last_checkpoint: CheckpointRef
    steps_lost: int
    restarts: int
    checkpoint_request: int
    failure_cause: JobFailureCause | None
    growth_declined: str
    idempotency_key: str | None
    last_step_at: float | None
    morph: Morph
    exclusions: Exclusions
    salvage: Salvage
    training: Training
    evaluation: Evaluation
    checkpoint_stall: CheckpointStall
    on_demand: OnDemandHold
    learning: Learning


class MoveFields(JobFields, total=False):
    """The keywords a job's ``move`` takes: a move into MORPHING names the action its trainers are told."""

    action: Action


class NodeFields(TypedDict, total=False):
    """The keywords ``move`` and ``amend`` take for a node (all but its name, incarnation and state)."""

    slots: int
    address: str
    joined_at: float
    job: str | None
    eviction_not_before: float | None
    gpus: tuple[Gpu, ...]
    instance: str
    lost_at: float | None
    flaps: int
    flapped_at: float | None
    quarantined_until: float | None
    suspected_at: float | None
    name_taken_at: float | None
    at_risk: AtRisk | None
    pool: PoolKind
    owner: str | None


def ranks_by_node(layout: Layout) -> dict[str, tuple[int, ...]]:
    """Node name -> the global ranks it runs in ``layout`` (in rank order), in one pass."""
    found: dict[str, list[int]] = {}
    for rank, slot in enumerate(layout.placement):
        found.setdefault(slot.node, []).append(rank)
    return {name: tuple(ranks) for name, ranks in found.items()}


@dataclass(frozen=True)
class SalvageOrder:
    """The just-in-time checkpoint the holding survivors of a generation write (an assignment's, from its job's
    :class:`Salvage`)."""

    step: int
    writers: tuple[int, ...]
    deadline: float


@dataclass(frozen=True)
class Assignment:
    """What one node should run: the reply to its heartbeat."""

    job: str
    generation: int
    ranks: tuple[int, ...]
    slots: tuple[int, ...]
    layout: Layout
    rendezvous: str
    checkpoint_dir: str
    resume: CheckpointRef  # the checkpoint to load (step 0: none)
    action: Action
    entrypoint: str
    spec: JobSpec
    checkpoint_request: int
    salvage: SalvageOrder | None = None
    held: CheckpointRef = CheckpointRef()  # take this step from the previous generation's memory (step 0: none)
    leaving: bool = False  # with STOP: the node leaves the job at this stop (a shrink gave it away): hand off
    await_leavers: bool = False  # with STOP: the leaving nodes start it; this node's trainers stop with them
