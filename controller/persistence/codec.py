"""Records to rows and back: how nodes, jobs, generations and events look in the state database."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Row

from controller.core.causes import MorphCause
from controller.core.events import EventKind
from controller.core.lifecycle import Transition
from controller.core.model import JobRecord, NodeRecord, StartGeneration
from controller.core.stimulus import Stimulus
from controller.eventlog.facts import GenerationIssued, StateChanged
from controller.persistence.plain import from_plain, to_plain

C = TypeVar("C", bound=StateChanged)


@dataclass(frozen=True)
class EventRow:
    seq: int
    at: float
    kind: str
    job: str | None
    node: str | None
    data: dict[str, Any]
    decision: int | None = None  # the decision that wrote it (None: written before decisions were numbered)
    stimulus: Stimulus | None = None  # what triggered that decision (None: it was made before schema 14 kept that)


@dataclass(frozen=True)
class GenerationRow:
    job: str
    generation: int
    layout: dict[str, Any]
    resume_step: int
    cause: str  # in words (the API shows them)
    morph_seconds: float | None
    issued_at: float
    morph_cause: MorphCause  # the label metrics count by
    pause_seconds: float | None = None  # last step before the morph to the first after it (None: not yet)
    stalled_seconds: float | None = None  # ... to the first after it begun (None: not yet, or unsaid)
    held_step: int = 0  # taken from the previous generation's memory (0: none; resume_step was loaded)

    @property
    def resumed_at_step(self) -> int:
        """The step it started from (its first step is the next): the memory it took, or its checkpoint.
        Status, the dashboard, TensorBoard and the demo all show this one."""
        return max(self.resume_step, self.held_step)


def node_to_dict(node: NodeRecord) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(node)
    return data


def node_from_dict(data: dict[str, Any]) -> NodeRecord:
    """A node row's record, every field read by its type (rows older than a field are completed by a migration)."""
    record: NodeRecord = from_plain(NodeRecord, data, "node")
    return record


def node_row(node: NodeRecord) -> dict[str, Any]:
    return {"name": node.name, "incarnation": node.incarnation, "state": str(node.state), "data": node_to_dict(node)}


def job_to_dict(job: JobRecord) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(job)
    return data


def job_from_dict(data: dict[str, Any]) -> JobRecord:
    """A job row's record, every field read by its type (rows older than a field are completed by a migration)."""
    record: JobRecord = from_plain(JobRecord, data, "job")
    return record


def generation_from_row(row: Row[Any]) -> GenerationRow:
    r, cause = row, MorphCause(row.morph_cause)
    return GenerationRow(
        r.job,
        r.generation,
        r.layout,
        r.resume_step,
        r.cause,
        r.morph_seconds,
        r.issued_at,
        cause,
        r.pause_seconds,
        r.stalled_seconds,
        r.held_step or 0,
    )


def event_from_row(row: Row[Any]) -> EventRow:
    """An ``events`` row joined with its decision's stimulus (NULL for decisions older than schema 14)."""
    return EventRow(row.seq, row.at, row.kind, row.job, row.node, row.data, row.decision, stimulus_from(row.stimulus))


def stimulus_to_dict(stimulus: Stimulus) -> dict[str, Any]:
    data: dict[str, Any] = to_plain(stimulus)
    return data


def stimulus_from(data: dict[str, Any] | None) -> Stimulus | None:
    stimulus: Stimulus | None = None if data is None else from_plain(Stimulus, data, "stimulus")
    return stimulus


def changed(fact: type[C], change: Transition) -> C:
    """A state change as the fact of its event (``NodeStateChanged``, ``JobStateChanged``, ``JobActionChanged``)."""
    return fact(change.source, change.target, change.cause, change.reason)


def event_row(
    at: float, kind: EventKind, job: str | None, node: str | None, data: dict[str, Any], decision: int
) -> dict[str, Any]:
    """An ``events`` row of ``decision``; ``data`` goes through JSON so it holds what reading it back gives."""
    data = json.loads(json.dumps(data))
    return {"at": at, "kind": str(kind), "job": job, "node": node, "data": data, "decision": decision}


def generation_issued(command: StartGeneration) -> GenerationIssued:
    """The ``GenerationIssued`` fact of a generation the store writes."""
    return GenerationIssued(
        command.generation,
        command.layout.describe(),
        command.resume.step,
        command.morph_detail,
        command.resume.generation,
        command.held.step,
        command.held.generation,
        str(command.morph_cause),
    )
