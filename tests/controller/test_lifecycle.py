"""The lifecycles walked edge by edge: every table edge is accepted, every other pair rejected."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from controller.core.changes import act, amend
from controller.core.lifecycle import (
    ACTION_TRANSITIONS,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    NODE_TERMINAL,
    NODE_TRANSITIONS,
    Action,
    IllegalTransition,
    JobState,
    NodeState,
    Transition,
    transition,
)
from controller.core.records import Morph
from tests.controller.helpers import job


def node_transition(name: str, source: NodeState, target: NodeState, reason: str, now: float) -> Transition:
    return transition(NODE_TRANSITIONS, "node", name, source, target, reason, now)


def job_transition(job_id: str, source: JobState, target: JobState, reason: str, now: float) -> Transition:
    return transition(JOB_TRANSITIONS, "job", job_id, source, target, reason, now)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(NodeState, NodeState)))
def test_node_edges(source: NodeState, target: NodeState) -> None:
    if (source, target) in NODE_TRANSITIONS:
        record = node_transition("node-1", source, target, "because", 12.5)
        assert (record.source, record.target, record.at, record.reason) == (source, target, 12.5, "because")
        assert record.cause == NODE_TRANSITIONS[(source, target)]
    else:
        with pytest.raises(IllegalTransition, match="not an edge"):
            node_transition("node-1", source, target, "because", 0.0)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(JobState, JobState)))
def test_job_edges(source: JobState, target: JobState) -> None:
    if (source, target) in JOB_TRANSITIONS:
        assert job_transition("j", source, target, "r", 1.0).cause == JOB_TRANSITIONS[(source, target)]
    else:
        with pytest.raises(IllegalTransition):
            job_transition("j", source, target, "r", 1.0)


def _reachable(table: Mapping[tuple[Any, Any], str], start: Any) -> set[Any]:
    seen, todo = {start}, [start]
    while todo:
        here = todo.pop()
        for a, b in table:
            if a == here and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_graphs_are_connected_and_terminal_states_are_sinks() -> None:
    assert _reachable(NODE_TRANSITIONS, NodeState.JOINING) == set(NodeState)
    assert _reachable(JOB_TRANSITIONS, JobState.QUEUED) == set(JobState)
    for node_state in NODE_TERMINAL:
        assert not [e for e in NODE_TRANSITIONS if e[0] == node_state]
    for job_state in JOB_TERMINAL:
        assert not [e for e in JOB_TRANSITIONS if e[0] == job_state]
    # every non-terminal state can reach a terminal one
    for live_job in set(JobState) - JOB_TERMINAL:
        assert _reachable(JOB_TRANSITIONS, live_job) & JOB_TERMINAL
    for live_node in set(NodeState) - NODE_TERMINAL:
        assert _reachable(NODE_TRANSITIONS, live_node) & NODE_TERMINAL


def test_every_edge_has_a_cause() -> None:
    tables = (NODE_TRANSITIONS, JOB_TRANSITIONS, ACTION_TRANSITIONS)
    assert all(cause.strip() for table in tables for cause in table.values())


@pytest.mark.parametrize(("source", "target"), list(itertools.product(Action, Action)))
def test_action_edges(source: Action, target: Action) -> None:
    """Every action edge is accepted by act() with its cause; every other change is refused; the same
    action again changes only the other fields."""
    record = job(state=JobState.MORPHING, action=source, morph=Morph(detail="eviction notice"))
    if source is target:
        same = act(record, target, "again", 5.0, restarts=2)
        assert same.action is None and same.job.action is source and same.job.restarts == 2
    elif (source, target) in ACTION_TRANSITIONS:
        command = act(record, target, "because", 5.0, restarts=2)
        assert command.job.action is target and command.job.restarts == 2 and command.change is None
        assert command.action is not None
        assert (command.action.kind, command.action.source, command.action.target) == ("action", source, target)
        assert command.action.cause == ACTION_TRANSITIONS[(source, target)] and command.action.at == 5.0
    else:
        with pytest.raises(IllegalTransition, match="not an edge"):
            act(record, target, "because", 5.0)


def test_the_action_graph_starts_at_run_and_every_action_leads_back_to_it() -> None:
    assert _reachable(ACTION_TRANSITIONS, Action.RUN) == set(Action)
    for action in Action:
        assert Action.RUN in _reachable(ACTION_TRANSITIONS, action) | ({action} if action is Action.RUN else set())


def test_only_a_move_or_an_act_sets_the_action() -> None:
    with pytest.raises(IllegalTransition, match="only a move sets action"):
        amend(job(), action=Action.STOP)  # type: ignore[call-overload]  # the runtime half of the type check
