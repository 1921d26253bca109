"""The one way a node or a job changes state, the one way a job's action changes, and the way other fields do.

:func:`move` checks the edge against its lifecycle table, applies what entering the target state
does to the record (:data:`NODE_ENTERING`, :data:`JOB_ENTERING`: data, read beside the transition
tables) and returns the command that persists the record with its timestamped :class:`Transition`.
:func:`act` changes a job's action along :data:`ACTION_TRANSITIONS` (a move into MORPHING names one,
the next generation sets RUN: those are checked against the same table). :func:`amend` changes other
fields and refuses the ones only a move or an act may write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, Unpack, overload

from controller.core.commands import SetJob, SetNode
from controller.core.lifecycle import (
    ACTION_TRANSITIONS,
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    IllegalTransition,
    JobState,
    NodeState,
    Transition,
    transition,
)
from controller.core.records import Action, JobFields, JobRecord, MoveFields, NodeFields, NodeRecord, Salvage

N = NodeState
J = JobState
S = TypeVar("S", NodeState, JobState)
R = TypeVar("R", NodeRecord, JobRecord)


@dataclass(frozen=True)
class Entering:
    """What entering a state does to a record besides setting ``state`` and ``state_since``."""

    sets: Mapping[str, object] = field(default_factory=dict)  # fixed values
    stamps: tuple[str, ...] = ()  # fields set to the time of the change
    requires: tuple[str, ...] = ()  # fields only the caller knows, which it must pass
    # a name may be a path into a nested record ("morph.started_at"): the rest of that record is kept
    begins: str | None = None  # a field stamped when an episode begins: the record came from outside ``spans``
    spans: frozenset[str] = frozenset()  # the states an episode lasts through (a queued job's reasons, morphs)


NODE_ENTERING: Mapping[NodeState, Entering] = {
    N.JOINING: Entering(),  # records start here (no edge leads back)
    N.READY: Entering(sets={"job": None, "eviction_not_before": None}),  # free, and no notice pending
    N.ASSIGNED: Entering(sets={"eviction_not_before": None}, requires=("job",)),  # the job that placed ranks on it
    N.DRAINING: Entering(requires=("eviction_not_before",)),  # when the provider takes it
    N.LOST: Entering(stamps=("lost_at",)),  # keeps its job, which sees the loss and aborts; a flap if it returns
    N.GONE: Entering(sets={"job": None}),  # a gone VM runs nothing
}

JOB_ENTERING: Mapping[JobState, Entering] = {
    # keeps morph.started_at: a morph that waits for capacity counts the wait; waiting begins unless it was queued
    J.QUEUED: Entering(begins="queued_since", spans=frozenset({J.QUEUED})),
    J.RUNNING: Entering(  # a new generation: its morph is over, no salvage of the last one pending
        sets={"action": Action.RUN, "morph.started_at": None, "salvage": Salvage()},
        requires=("generation", "layout"),
        begins="running_since",  # from the queue; a morph's next generation keeps it
        spans=frozenset({J.RUNNING, J.MORPHING}),
    ),
    J.MORPHING: Entering(stamps=("morph.started_at",), requires=("action", "morph.cause")),
    J.SUCCEEDED: Entering(),
    J.FAILED: Entering(requires=("failure_cause",)),  # a label beside the reason
    J.CANCELLED: Entering(),
}


@dataclass(frozen=True)
class Lifecycle(Generic[S]):
    kind: str  # "node" or "job", as in the event log
    edges: Mapping[tuple[S, S], str]
    entering: Mapping[S, Entering]
    reason_field: str | None  # where the record keeps why it last changed state

    def change(self, subject: str, source: S, target: S, reason: str, now: float) -> Transition:
        return transition(self.edges, self.kind, subject, source, target, reason, now)

    def managed(self) -> frozenset[str]:
        """Fields only a move writes (and a job's action, which an act writes too)."""
        extra: set[str] = {"action"} if self.kind == "job" else set()
        extra |= {entry.begins for entry in self.entering.values() if entry.begins}
        return frozenset({"state", "state_since", *extra, *([self.reason_field] if self.reason_field else [])})


NODE_LIFECYCLE = Lifecycle[NodeState]("node", NODE_TRANSITIONS, NODE_ENTERING, None)
JOB_LIFECYCLE = Lifecycle[JobState]("job", JOB_TRANSITIONS, JOB_ENTERING, "reason")


@overload
def move(record: NodeRecord, target: NodeState, reason: str, now: float, **fields: Unpack[NodeFields]) -> SetNode: ...
@overload
def move(record: JobRecord, target: JobState, reason: str, now: float, **fields: Unpack[MoveFields]) -> SetJob: ...
def move(
    record: NodeRecord | JobRecord, target: NodeState | JobState, reason: str, now: float, **fields: Any
) -> SetNode | SetJob:
    """``record`` in state ``target`` and the command that persists it; :class:`IllegalTransition` if not an edge."""
    if isinstance(record, NodeRecord):
        node_target = NodeState(target)
        change = NODE_LIFECYCLE.change(record.name, record.state, node_target, reason, now)
        return SetNode(_entered(NODE_LIFECYCLE, record.name, record, node_target, reason, now, fields), change)
    job_target = JobState(target)
    change = JOB_LIFECYCLE.change(record.id, record.state, job_target, reason, now)
    entered = _entered(JOB_LIFECYCLE, record.id, record, job_target, reason, now, fields)
    return SetJob(entered, change, _action_change(record, entered.action, reason, now))


def act(record: JobRecord, action: Action, reason: str, now: float, **fields: Unpack[JobFields]) -> SetJob:
    """``record`` told to ``action`` (other fields changed as :func:`amend` does); :class:`IllegalTransition`
    if that is not an edge of :data:`ACTION_TRANSITIONS`. The same action again changes only the fields."""
    changed = replace(record, **_unmanaged(JOB_LIFECYCLE, record.id, fields), action=action)
    return SetJob(changed, None, _action_change(record, action, reason, now))


def _action_change(record: JobRecord, action: Action, reason: str, now: float) -> Transition | None:
    if action is record.action:
        return None
    return transition(ACTION_TRANSITIONS, "action", record.id, record.action, action, reason, now)


@overload
def amend(record: NodeRecord, **fields: Unpack[NodeFields]) -> SetNode: ...
@overload
def amend(record: JobRecord, **fields: Unpack[JobFields]) -> SetJob: ...
def amend(record: NodeRecord | JobRecord, **fields: Any) -> SetNode | SetJob:
    """``record`` with other fields than its state changed, and the command that persists it."""
    if isinstance(record, NodeRecord):
        return SetNode(replace(record, **_unmanaged(NODE_LIFECYCLE, record.name, fields)))
    return SetJob(replace(record, **_unmanaged(JOB_LIFECYCLE, record.id, fields)))


def _unmanaged(lifecycle: Lifecycle[S], subject: str, fields: Mapping[str, Any]) -> Mapping[str, Any]:
    managed = lifecycle.managed() & set(fields)
    if managed:
        raise IllegalTransition(f"{lifecycle.kind} {subject}: only a move sets {', '.join(sorted(managed))}")
    return fields


def _entered(
    lifecycle: Lifecycle[S], subject: str, record: R, target: S, reason: str, now: float, fields: Mapping[str, Any]
) -> R:
    entry: Entering = lifecycle.entering[target]
    fixed = {*entry.sets, *entry.stamps} & set(fields)
    if fixed:
        raise IllegalTransition(f"{lifecycle.kind} {subject}: entering {target} sets {', '.join(sorted(fixed))} itself")
    missing = [name for name in entry.requires if _passed(fields, name) is None]
    if missing:
        raise IllegalTransition(f"{lifecycle.kind} {subject}: entering {target} needs {', '.join(missing)}")
    required = {name.partition(".")[0] for name in entry.requires}
    named = {name: value for name, value in fields.items() if name in required}  # managed ones included
    others = {name: value for name, value in fields.items() if name not in required}
    updates: dict[str, Any] = {**_unmanaged(lifecycle, subject, others), **named, "state": target}
    updates.update({**entry.sets, **{name: now for name in ("state_since", *entry.stamps)}})
    if entry.begins is not None and record.state not in entry.spans:
        updates[entry.begins] = now
    if lifecycle.reason_field is not None:
        updates[lifecycle.reason_field] = reason
    changed: R = _with(record, updates)
    return changed


def _passed(fields: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` ("morph.cause") in what the caller passed; None when it passed none."""
    head, _, rest = path.partition(".")
    value = fields.get(head)
    for name in rest.split(".") if rest and value is not None else ():
        value = getattr(value, name)
    return value


def _with(record: Any, updates: Mapping[str, Any]) -> Any:
    """``record`` with ``updates``, whose names may be paths into nested records (applied after whole ones)."""
    whole = {name: value for name, value in updates.items() if "." not in name}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in updates.items():
        if "." in path:
            head, _, rest = path.partition(".")
            nested.setdefault(head, {})[rest] = value
    changed = replace(record, **whole)
    inner = {head: _with(getattr(changed, head), parts) for head, parts in nested.items()}
    return replace(changed, **inner) if inner else changed
