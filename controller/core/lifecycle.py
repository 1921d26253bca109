"""Node and job lifecycles, and a job's action, as data: one transition table each, one function that changes them.

Every legal edge is a key of a table whose value is the cause of that edge, so the graph can be read
(and walked by tests) without reading code. :func:`transition` rejects illegal edges and returns a
timestamped record that the store appends to the event log; :func:`controller.core.changes.move` (a
state) and :func:`controller.core.changes.act` (an action), the only code that writes them, call it.
:data:`JOB_STATE_ACTIONS` says which action a job may be told in each state (checked, not enforced, by
:mod:`controller.core.invariants`).
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


class Action(StrEnum):
    """What the trainers of a job's current generation should do."""

    RUN = "RUN"
    STOP = "STOP"  # agree on the next step boundary, checkpoint (or keep the step in memory), exit 0
    ABORT = "ABORT"  # exit now: a peer is gone and collectives would hang
    HOLD = "HOLD"  # a collective failed: survivors hold their last completed step; named writers write it


N = NodeState
J = JobState
A = Action

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
    (J.RUNNING, J.MORPHING): "eviction notice or risk, lost node, trainer failure or growth that pays off",
    (J.MORPHING, J.RUNNING): "the next generation was issued",
    (J.MORPHING, J.QUEUED): "no layout fits the nodes left: waiting for capacity",
    (J.RUNNING, J.SUCCEEDED): "every rank finished the last step",
    (J.MORPHING, J.SUCCEEDED): "every rank finished the last step before stopping",
    (J.RUNNING, J.FAILED): "trainers refused its input, or failed more often than max_restarts",
    (J.MORPHING, J.FAILED): "trainers refused its input, or failed more often than max_restarts",
    (J.RUNNING, J.CANCELLED): "cancelled by an operator",
    (J.MORPHING, J.CANCELLED): "cancelled by an operator",
}

# A job's action changes with a move into MORPHING (which names it), on its own while it morphs
# (:func:`controller.core.changes.act`), and back to RUN when the next generation is issued.
ACTION_TRANSITIONS: Mapping[tuple[Action, Action], str] = {
    (A.RUN, A.STOP): "a planned morph (an eviction notice or risk, growth that pays off): stop at a step boundary",
    (A.RUN, A.ABORT): "a node lost, a trainer failed or could not start, or a peer unreachable: exit now",
    (A.RUN, A.HOLD): "a collective failed: the survivors hold their last completed step for a salvage",
    (A.STOP, A.ABORT): "a node went while stopping, or the stop timed out",
    (A.HOLD, A.STOP): "the salvaged step stays in the survivors' memory: they stop as a planned morph's do",
    (A.HOLD, A.ABORT): "the salvage committed its step, or gave up: resume from the newest committed checkpoint",
    (A.STOP, A.RUN): "the next generation was issued",
    (A.ABORT, A.RUN): "the next generation was issued",
}

# The (state, action) pairs a job record may hold, each with the decision that leaves it so; any other pair is a
# bug (controller.core.invariants checks every decided world against this table). Entering RUNNING sets RUN,
# entering MORPHING names STOP, ABORT or HOLD, and the other states keep the action they were entered with.
JOB_STATE_ACTIONS: Mapping[tuple[JobState, Action], str] = {
    (J.QUEUED, A.RUN): "submitted: no generation has told its trainers anything yet",
    (J.QUEUED, A.STOP): "a planned morph stopped, then no layout fitted: the word kept until the next generation",
    (J.QUEUED, A.ABORT): "an unplanned morph (or a salvage that ended) found no layout: the word kept likewise",
    # never (QUEUED, HOLD): a morph leaves for the queue only once its salvage ended (advance_morph)
    (J.RUNNING, A.RUN): "entering RUNNING sets RUN: the generation's trainers train",
    # never (RUNNING, STOP|ABORT|HOLD): any other word is a morph, and a morph is MORPHING
    (J.MORPHING, A.STOP): "a planned morph (eviction notice or risk, growth), or a salvage whose step stays in memory",
    (J.MORPHING, A.ABORT): "an unplanned morph, a stop that could not finish, or a salvage that ended",
    (J.MORPHING, A.HOLD): "a collective failed: the survivors hold their last step while it is salvaged",
    # never (MORPHING, RUN): RUN comes back only with the next generation, which is RUNNING
    (J.SUCCEEDED, A.RUN): "every rank finished the last step while the job ran",
    (J.SUCCEEDED, A.STOP): "every rank finished the last step before the stop took effect",
    (J.SUCCEEDED, A.ABORT): "every rank finished the last step before the abort took effect",
    # never (SUCCEEDED, HOLD): a holding job's salvage is decided before its end is looked for (advance_morph)
    (J.FAILED, A.RUN): "trainers refused their input, or failed past max_restarts, or the job could not be planned",
    (J.FAILED, A.STOP): "its planner failed, or decisions about it did, while it stopped",
    (J.FAILED, A.ABORT): "its planner failed, or decisions about it did, while it aborted",
    (J.FAILED, A.HOLD): "a collective failed with every node alive, past max_restarts",
    (J.CANCELLED, A.RUN): "cancelled while queued or running",
    (J.CANCELLED, A.STOP): "cancelled while it stopped (or queued after a stop)",
    (J.CANCELLED, A.ABORT): "cancelled while it aborted (or queued after an abort)",
    (J.CANCELLED, A.HOLD): "cancelled while its survivors held a step for a salvage",
}

NODE_TERMINAL = frozenset({N.GONE})
JOB_TERMINAL = frozenset({J.SUCCEEDED, J.FAILED, J.CANCELLED})
JOB_ACTIVE = frozenset({J.RUNNING, J.MORPHING})  # a generation of it holds nodes (its trainers run or stop)
JOB_LIVE = frozenset(JobState) - JOB_TERMINAL  # queued or active: it still wants nodes

S = TypeVar("S", NodeState, JobState, Action)


class IllegalTransition(RuntimeError):
    """A state change that is not an edge of its lifecycle; a bug in the caller, never user input."""


@dataclass(frozen=True)
class Transition:
    """A state change that happened: the edge, its cause from the table, why, and when."""

    kind: str  # "node", "job", or "action" (a job's)
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
