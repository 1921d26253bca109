"""What each event the controller decides says: one frozen dataclass per kind, its fields the event's data.

As the trainer's events are (:mod:`worker_agent.contract.events`), so are the controller's own: a decision
says ``draft.event(CollectiveFailed(generation=3, rank=1, ...), job, node)`` and mypy checks the fields,
where a ``**data`` of any keys would store a misspelt one silently. :meth:`Fact.data` is what the event log
keeps (a field left ``None`` where the class marks it optional is left out). The providers' events are
:mod:`controller.providers.facts`; the store derives the state changes' and generations' events from the
typed commands it writes (a :class:`~controller.core.lifecycle.Transition`, a ``StartGeneration``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from controller.core.commands import RecordEvent
from controller.core.events import EventKind


@dataclass(frozen=True)
class Fact:
    kind: ClassVar[EventKind]
    optional: ClassVar[frozenset[str]] = frozenset()  # fields left out of the data while None

    def data(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if not (v is None and k in self.optional)}

    def recorded(self, at: float, job: str | None = None, node: str | None = None) -> RecordEvent:
        """The command that writes this fact to the event log, at ``at``, of ``job`` and ``node``."""
        return RecordEvent(self.kind, at, job, node, self.data())


@dataclass(frozen=True)
class NodeRegistered(Fact):
    kind = EventKind.NODE_REGISTERED
    incarnation: int
    slots: int
    address: str
    gpus: list[dict[str, Any]]


@dataclass(frozen=True)
class NodeHeld(Fact):
    kind = EventKind.NODE_HELD
    flaps: int
    lost_at: float | None
    hold_seconds: float
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
    optional = frozenset({"step", "holders", "writers_failed", "nodes_gone", "stages_lost", "resume_step"})
    generation: int
    reason: str
    step: int | None = None  # the step salvaged (None: no step every stage holds)
    holders: list[int] | None = None  # the step stays in these ranks' memory
    writers_failed: list[int] | None = None
    nodes_gone: list[str] | None = None
    stages_lost: list[int] | None = None  # no survivor holds these stages
    resume_step: int | None = None  # it fell back: the next generation resumes from this committed step


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
