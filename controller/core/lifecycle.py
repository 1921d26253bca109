"""Node and job lifecycles as data: one transition table each, one function that changes state.

Every legal edge is a key of a table whose value is the cause of that edge, so the graph can be read
(and walked by tests) without reading code. :func:`transition` rejects illegal edges and returns a
timestamped record that the store appends to the event log; :func:`controller.core.changes.move`, the
only code that writes a record's state, calls it and applies what entering the target state does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar


class NodeState(StrEnum):
    JOINING = "JOINING"
    READY = "READY"
    ASSIGNED = "ASSIGNED"
    DRAINING = "DRAINING"
    LOST = "LOST"
    GONE = "GONE"


class JobState(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    MORPHING = "MORPHING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


N = NodeState
J = JobState

NODE_TRANSITIONS: Mapping[tuple[NodeState, NodeState], str] = {
    (N.JOINING, N.READY): "first heartbeat after registration",
    (N.JOINING, N.DRAINING): "eviction notice before the first heartbeat",
    (N.JOINING, N.GONE): "no heartbeat ever came, the provider released it, or the agent re-registered",
    (N.READY, N.ASSIGNED): "a generation placed ranks on it",
    (N.ASSIGNED, N.READY): "its job ended or moved to other nodes",
    (N.READY, N.DRAINING): "eviction notice",
    (N.ASSIGNED, N.DRAINING): "eviction notice",
    (N.READY, N.LOST): "heartbeats stopped",
    (N.ASSIGNED, N.LOST): "heartbeats stopped",
    (N.DRAINING, N.READY): "eviction notice withdrawn (it held no job by then)",
    (N.DRAINING, N.ASSIGNED): "eviction notice withdrawn while its job still held it",
    (N.DRAINING, N.GONE): "evicted: heartbeats stopped, the provider released it, or the agent re-registered",
    (N.LOST, N.GONE): "the provider no longer lists it, or the agent came back as a new incarnation",
    (N.READY, N.GONE): "the provider no longer lists it, or the agent re-registered",
    (N.ASSIGNED, N.GONE): "the provider no longer lists it, or the agent re-registered",
}

JOB_TRANSITIONS: Mapping[tuple[JobState, JobState], str] = {
    (J.QUEUED, J.RUNNING): "admitted: the first (or next) generation was issued",
    (J.QUEUED, J.QUEUED): "still queued: what it waits for changed (e.g. GPU nodes)",
    (J.QUEUED, J.CANCELLED): "cancelled by an operator",
    (J.QUEUED, J.FAILED): "cannot run: its profile or spec became unusable",
    (J.RUNNING, J.MORPHING): "eviction notice, lost node, trainer failure or growth that pays off",
    (J.MORPHING, J.RUNNING): "the next generation was issued",
    (J.MORPHING, J.QUEUED): "no layout fits the nodes left: waiting for capacity",
    (J.RUNNING, J.SUCCEEDED): "every rank finished the last step",
    (J.MORPHING, J.SUCCEEDED): "every rank finished the last step before stopping",
    (J.RUNNING, J.FAILED): "trainers refused its input, or failed more often than max_restarts",
    (J.MORPHING, J.FAILED): "trainers refused its input, or failed more often than max_restarts",
    (J.RUNNING, J.CANCELLED): "cancelled by an operator",
    (J.MORPHING, J.CANCELLED): "cancelled by an operator",
}

NODE_TERMINAL = frozenset({N.GONE})
JOB_TERMINAL = frozenset({J.SUCCEEDED, J.FAILED, J.CANCELLED})

S = TypeVar("S", NodeState, JobState)


class IllegalTransition(RuntimeError):
    """A state change that is not an edge of its lifecycle; a bug in the caller, never user input."""


@dataclass(frozen=True)
class Transition:
    """A state change that happened: the edge, its cause from the table, why, and when."""

    kind: str  # "node" or "job"
    subject: str
    source: str
    target: str
    cause: str
    reason: str
    at: float


def transition(
    table: Mapping[tuple[S, S], str], kind: str, subject: str, source: S, target: S, reason: str, now: float
) -> Transition:
    """The record of ``source -> target`` for ``subject``; :class:`IllegalTransition` if not an edge."""
    cause = table.get((source, target))
    if cause is None:
        raise IllegalTransition(f"{kind} {subject}: {source} -> {target} is not an edge ({reason})")
    return Transition(kind, subject, str(source), str(target), cause, reason, now)
