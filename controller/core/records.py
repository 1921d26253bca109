"""Records the store keeps (nodes, jobs) and the assignment a node's heartbeat is answered with."""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import Action, JobState, NodeState
from morphing.jobspec import JobSpec
from morphing.layout import Layout

__all__ = ["Action"]  # its lifecycle (ACTION_TRANSITIONS) lives beside the states'


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node as its agent reported it at registration."""

    index: int  # the CUDA device index its trainers use
    name: str
    memory_bytes: int


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
    held_until: float | None = None  # a JOINING node that flapped gets no work before this


@dataclass(frozen=True)
class Training:
    """What a job's trainers last said of their training: the newest step's loss and rate."""

    loss: float | None = None  # the global-batch loss of ``step`` (None: none reported yet)
    step: int = 0
    samples_per_second: float | None = None
    reported_at: float | None = None  # when the last TrainingProgressed event was recorded (its rate bound)
    generation: int = 0  # the generation that reported it


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
    resume_step: int = 0  # checkpoint step ``generation`` started from (0: from scratch)
    resume_generation: int = 0  # the generation that committed it (its directory, step-NNNNNNNN-gG)
    held_step: int = 0  # the step the previous generation stopped at and keeps in memory (0: none)
    held_generation: int = 0  # that generation
    step: int = 0  # newest step any rank of the job finished
    last_checkpoint_step: int = 0
    last_checkpoint_generation: int = 0  # the generation that committed ``last_checkpoint_step``
    steps_lost: int = 0
    restarts: int = 0
    checkpoint_request: int = 0  # bumped to ask for a checkpoint at the next step boundary
    morph_started_at: float | None = None
    morph_cause: MorphCause | None = None  # why the current (or last) morph began
    morph_detail: str = ""  # the same in words, naming nodes and figures
    reason: str = ""
    failure_cause: JobFailureCause | None = None  # set on entering FAILED; ``reason`` holds the words
    excluded_nodes: tuple[str, ...] = ()  # nodes where this job's trainers could not start
    # nodes its peers could not reach (reconcile.unreachable): the failed starts seen, and who is left out until when
    rendezvous_failures: tuple[tuple[str, str, float], ...] = ()  # (node, rendezvous host it could not reach, when)
    excluded_until: tuple[tuple[str, float], ...] = ()
    growth_declined: str = ""  # the (generation, free nodes) whose growth was last declined: said once
    idempotency_key: str | None = None  # the key its SubmitJob carried: a retry with it gets this job back
    eval_step: int = 0  # the step of the newest evaluation reported (0: none yet)
    eval_loss: float | None = None  # its mean loss over the eval dataset (the same in every layout)
    # the newest checkpoint's stall: how long training paused for it (its slowest rank), and its step and generation
    checkpoint_stall_seconds: float | None = None  # None: no checkpoint reported yet
    checkpoint_stall_step: int = 0
    checkpoint_stall_generation: int = 0
    last_step_at: float | None = None  # trainers' wall clock when the newest step reported was completed
    paused_since: float | None = None  # while generation's first step is awaited: the last step before the pause
    decision_seconds: float | None = None  # how long the controller took to issue the current generation
    # an unplanned loss (action HOLD): the nodes not heard from since the failure, and the salvage ordered
    suspected: tuple[str, ...] = ()
    salvage_step: int = 0  # the step the writers write (0: none ordered yet)
    salvage_writers: tuple[int, ...] = ()  # one rank per stage, in stage order
    salvage_deadline: float = 0.0  # nothing is written after it; the controller falls back then
    training: Training = Training()

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.layout.nodes() if self.layout else ()


def ranks_by_node(layout: Layout) -> dict[str, tuple[int, ...]]:
    """Node name -> the global ranks it runs in ``layout`` (in rank order), in one pass."""
    found: dict[str, list[int]] = {}
    for rank, slot in enumerate(layout.placement):
        found.setdefault(slot.node, []).append(rank)
    return {name: tuple(ranks) for name, ranks in found.items()}


@dataclass(frozen=True)
class Salvage:
    """The just-in-time checkpoint the holding survivors of a generation write."""

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
    resume_step: int
    resume_generation: int
    action: Action
    entrypoint: str
    spec: JobSpec
    checkpoint_request: int
    salvage: Salvage | None = None
    held_step: int = 0  # take this step from the previous generation's memory (0: none)
    held_generation: int = 0
