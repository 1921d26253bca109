"""Values the controller decides on: persisted records, observations from heartbeats, commands.

Records (nodes, jobs) live in the store; observations are what agents report and are re-sent with
every heartbeat, so losing them (a restart) only delays decisions until the next beat. Commands are
what :mod:`controller.core.reconcile` returns and :mod:`controller.shell.runner` persists, then performs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from controller.core.lifecycle import JobState, NodeState, Transition
from controller.spec import JobSpec
from morphing.layout import Layout


class Action(StrEnum):
    """What the trainers of a generation should do."""

    RUN = "RUN"
    STOP = "STOP"  # agree on the next step boundary, checkpoint, exit 0
    ABORT = "ABORT"  # exit now: a peer is gone and collectives would hang


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
    step: int = 0  # newest step any rank of the job finished
    last_checkpoint_step: int = 0
    steps_lost: int = 0
    restarts: int = 0
    checkpoint_request: int = 0  # bumped to ask for a checkpoint at the next step boundary
    morph_started_at: float | None = None
    morph_cause: str = ""
    reason: str = ""
    excluded_nodes: tuple[str, ...] = ()  # nodes where this job's trainers could not start

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.layout.nodes() if self.layout else ()


@dataclass(frozen=True)
class RankReport:
    """One trainer as an agent sees it."""

    job: str
    generation: int
    rank: int
    running: bool
    exit_code: int | None = None
    last_step: int = 0
    last_checkpoint_step: int = 0
    error: str = ""


@dataclass(frozen=True)
class NodeObservation:
    incarnation: int
    last_seen: float
    ranks: tuple[RankReport, ...] = ()
    eviction_not_before: float | None = None


@dataclass(frozen=True)
class World:
    """Everything reconcile may look at: stored records, observations, and when this controller started."""

    nodes: Mapping[str, NodeRecord]
    jobs: Mapping[str, JobRecord]
    observed: Mapping[str, NodeObservation] = field(default_factory=dict)
    started_at: float = 0.0


def ranks_by_node(layout: Layout) -> dict[str, tuple[int, ...]]:
    """Node name -> the global ranks it runs in ``layout`` (in rank order), in one pass."""
    found: dict[str, list[int]] = {}
    for rank, slot in enumerate(layout.placement):
        found.setdefault(slot.node, []).append(rank)
    return {name: tuple(ranks) for name, ranks in found.items()}


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
    action: Action
    entrypoint: str
    spec: JobSpec
    checkpoint_request: int


# Commands: imperatives the runner persists (in one transaction), then acts on.


@dataclass(frozen=True)
class SetNode:
    node: NodeRecord
    change: Transition | None = None


@dataclass(frozen=True)
class SetJob:
    job: JobRecord
    change: Transition | None = None


@dataclass(frozen=True)
class StartGeneration:
    """Persist generation ``generation`` of ``job_id`` (unique per job: issuing one twice fails)."""

    job_id: str
    generation: int
    layout: Layout
    resume_step: int
    cause: str
    morph_seconds: float | None
    at: float


@dataclass(frozen=True)
class RecordCheckpoint:
    job_id: str
    generation: int
    step: int
    at: float


@dataclass(frozen=True)
class RecordEvent:
    """A past-tense fact for the event log (``NodeRegistered``, ``EvictionNoticed``, ...)."""

    kind: str
    at: float
    job: str | None = None
    node: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseInstance:
    """Ask the provider to give back a VM that is gone or lost (a side effect, after persisting)."""

    node: str


@dataclass(frozen=True)
class RequestCapacity:
    """Tell the provider how many slots the controller wants in all (a level; a side effect, after persisting)."""

    slots: int


Command = SetNode | SetJob | StartGeneration | RecordCheckpoint | RecordEvent | ReleaseInstance | RequestCapacity


def apply(world: World, commands: list[Command]) -> World:
    """The world after ``commands``: what the store holds once the runner persisted them."""
    nodes = dict(world.nodes)
    jobs = dict(world.jobs)
    for command in commands:
        if isinstance(command, SetNode):
            nodes[command.node.name] = command.node
        elif isinstance(command, SetJob):
            jobs[command.job.id] = command.job
    return World(nodes, jobs, world.observed, world.started_at)
