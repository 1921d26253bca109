"""Commands: imperatives reconcile returns and the runner persists (in one transaction), then acts on.

``RecordEvent`` lives with the facts it writes (:mod:`controller.eventlog.fact`), where the log's readers find them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.core.causes import MorphCause
from controller.core.lifecycle import Transition
from controller.core.records import CheckpointRef, JobRecord, NodeRecord
from controller.eventlog.fact import RecordEvent
from morphing.layout import Layout
from scheduler.forecast import PoolStats
from scheduler.pools import PoolKind


@dataclass(frozen=True)
class SetNode:
    node: NodeRecord
    change: Transition | None = None


@dataclass(frozen=True)
class SetJob:
    job: JobRecord
    change: Transition | None = None  # its state changed
    action: Transition | None = None  # its action changed (with a state change, or alone)


@dataclass(frozen=True)
class AddJob:
    """Store a submitted job as job number ``seq`` (with its ``JobSubmitted`` event and its idempotency key)."""

    job: JobRecord
    seq: int


@dataclass(frozen=True)
class SetNodeSeq:
    """Remember that ``seq`` node names were generated (``node-1`` .. ``node-<seq>``), whatever names were asked for."""

    seq: int


@dataclass(frozen=True)
class StartGeneration:
    """Persist generation ``generation`` of ``job_id`` (unique per job: issuing one twice fails)."""

    job_id: str
    generation: int
    layout: Layout
    resume: CheckpointRef  # the checkpoint it loads (step 0: from scratch)
    morph_cause: MorphCause
    morph_detail: str  # the cause in words, for people
    morph_seconds: float | None
    at: float
    held: CheckpointRef = field(default_factory=CheckpointRef)  # the step the previous generation keeps in memory


@dataclass(frozen=True)
class RecordCheckpoint:
    job_id: str
    generation: int
    step: int
    at: float


@dataclass(frozen=True)
class RecordPause:
    """Generation ``generation`` of ``job_id`` completed its first step ``seconds`` after the last step before it,
    and began it ``stalled`` seconds after (None: no rank said how long its first step took)."""

    job_id: str
    generation: int
    seconds: float
    stalled: float | None = None


@dataclass(frozen=True)
class ForgetNode:
    """Delete a GONE node's record (:mod:`controller.core.retention`); ``incarnation`` raises the floor of new ones."""

    node: str
    incarnation: int


@dataclass(frozen=True)
class ReleaseInstance:
    """Ask the provider to give back a VM that is gone or lost (a side effect, after persisting)."""

    node: str


@dataclass(frozen=True)
class RequestCapacity:
    """Tell the provider how many slots of ``pool`` the controller wants in all (a level per pool; a side effect,
    after persisting)."""

    slots: int
    pool: PoolKind = PoolKind.SPOT


@dataclass(frozen=True)
class SetPoolStats:
    """Store a pool's history as the forecast counts it (``scheduler.forecast.PoolStats``: evictions, arrivals and
    exposure), so a restarted controller forecasts from all it has seen."""

    stats: PoolStats


Command = (
    SetNode
    | SetJob
    | AddJob
    | SetNodeSeq
    | StartGeneration
    | RecordCheckpoint
    | RecordPause
    | RecordEvent
    | ForgetNode
    | ReleaseInstance
    | RequestCapacity
    | SetPoolStats
)
