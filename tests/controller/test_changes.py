"""The one function that moves a node or a job, walked over every pair of states of both lifecycles."""

from __future__ import annotations

import ast
import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from controller.core.causes import MorphCause
from controller.core.changes import JOB_ENTERING, JOB_LIFECYCLE, NODE_ENTERING, NODE_LIFECYCLE, Entering, amend, move
from controller.core.lifecycle import (
    ACTION_TRANSITIONS,
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    IllegalTransition,
    JobState,
    NodeState,
)
from controller.core.records import Action, JobFields, JobRecord, Morph, MoveFields, NodeFields, NodeRecord, Salvage
from tests.controller.helpers import REPO, job, node, planner

NOW = 50.0
LAYOUT = planner().plan([("node-1", 2)]).layout  # type: ignore[union-attr]
# what a caller knows when it moves a record into each state (the fields an Entering requires, or holds a path into)
KNOWN: dict[str, Any] = {
    "job": "j1",
    "eviction_not_before": 80.0,
    "generation": 3,
    "layout": LAYOUT,
    "action": Action.STOP,
    "morph": Morph(cause=MorphCause.EVICTION, detail="eviction notice: node-1"),
    "failure_cause": "user_error",
}


def _unchanged(before: NodeRecord | JobRecord, after: object, touched: set[str]) -> list[str]:
    """Fields outside ``touched`` that differ between ``before`` and ``after``."""
    names = [f.name for f in fields(before) if f.name not in touched]
    return [name for name in names if getattr(before, name) != getattr(after, name)]


def _at(record: Any, path: str) -> Any:
    for name in path.split("."):
        record = getattr(record, name)
    return record


def _heads(paths: Iterable[str]) -> set[str]:
    return {path.partition(".")[0] for path in paths}


def _passed(entry: Entering) -> dict[str, Any]:
    return {name: KNOWN[name] for name in _heads(entry.requires)}


def _check_entry(before: Any, after: Any, entry: Entering, passed: dict[str, Any], touched: set[str]) -> None:
    assert after.state_since == NOW
    assert all(_at(after, path) == value for path, value in entry.sets.items())
    assert all(_at(after, path) == NOW for path in entry.stamps)
    for path in entry.requires:
        head, _, rest = path.partition(".")
        assert _at(after, path) == (_at(passed[head], rest) if rest else passed[head])
    for path in (*entry.sets, *entry.stamps):  # a path into a nested record keeps the rest of it as passed or held
        head, _, rest = path.partition(".")
        if rest:
            held = passed.get(head, getattr(before, head))
            assert replace(_at(after, head), **{rest: _at(held, rest)}) == held
    begun = set()
    if entry.begins is not None:  # an episode's start: stamped when the record came from outside it, else kept
        assert getattr(after, entry.begins) == (getattr(before, entry.begins) if before.state in entry.spans else NOW)
        begun.add(entry.begins)
    assert _unchanged(before, after, touched | _heads([*entry.sets, *entry.stamps]) | set(passed) | begun) == []


@pytest.mark.parametrize(("source", "target"), list(itertools.product(NodeState, NodeState)))
def test_every_node_edge_moves_and_every_other_pair_is_refused(source: NodeState, target: NodeState) -> None:
    before = replace(node("node-1", source, job="j0", at=1.0), eviction_not_before=None)
    entry = NODE_ENTERING[target]
    passed = _passed(entry)
    if (source, target) not in NODE_TRANSITIONS:
        with pytest.raises(IllegalTransition, match="not an edge"):
            move(before, target, "because", NOW, **passed)
        return
    command = move(before, target, "because", NOW, **passed)
    after, change = command.node, command.change
    assert after.state is target and change is not None
    assert (change.kind, change.subject, change.source, change.target) == ("node", "node-1", source, target)
    assert (change.cause, change.reason, change.at) == (NODE_TRANSITIONS[(source, target)], "because", NOW)
    _check_entry(before, after, entry, passed, {"state", "state_since"})


@pytest.mark.parametrize(("source", "target"), list(itertools.product(JobState, JobState)))
def test_every_job_edge_moves_and_every_other_pair_is_refused(source: JobState, target: JobState) -> None:
    action = Action.ABORT if source is JobState.MORPHING else Action.RUN  # what a job in that state is told
    before = job("j1", source, at=1.0, morph=Morph(started_at=2.0, detail="x"), action=action, reason="earlier")
    entry = JOB_ENTERING[target]
    passed = _passed(entry)
    if (source, target) not in JOB_TRANSITIONS:
        with pytest.raises(IllegalTransition, match="not an edge"):
            move(before, target, "because", NOW, **passed)
        return
    command = move(before, target, "because", NOW, **passed)
    after, change = command.job, command.change
    assert after.state is target and after.reason == "because" and change is not None
    assert (change.kind, change.subject, change.source, change.target) == ("job", "j1", source, target)
    assert (change.cause, change.at) == (JOB_TRANSITIONS[(source, target)], NOW)
    _check_entry(before, after, entry, passed, {"state", "state_since", "reason"})
    if after.action is before.action:
        assert command.action is None
    else:  # the move changed the action too, along its own table
        assert command.action is not None and (command.action.source, command.action.target) == (action, after.action)
        assert command.action.cause == ACTION_TRANSITIONS[(action, after.action)] and command.action.reason == "because"


def test_every_state_says_what_entering_it_does() -> None:
    assert set(NODE_ENTERING) == set(NodeState) and set(JOB_ENTERING) == set(JobState)
    node_fields = {f.name for f in fields(NodeRecord)}
    job_fields = {f.name for f in fields(JobRecord)}
    for entries, known in ((NODE_ENTERING, node_fields), (JOB_ENTERING, job_fields)):
        for entry in entries.values():
            assert _heads([*entry.sets, *entry.stamps, *entry.requires, *filter(None, [entry.begins])]) <= known


def test_gone_and_ready_nodes_hold_no_job_and_running_jobs_run() -> None:
    assert move(node("n", NodeState.LOST, job="j"), NodeState.GONE, "gone", NOW).node.job is None
    assert move(node("n", NodeState.ASSIGNED, job="j"), NodeState.READY, "freed", NOW).node.job is None
    assert move(node("n", NodeState.READY, job="j"), NodeState.LOST, "silent", NOW).node.job == "j"
    morph = Morph(started_at=3.0, cause=MorphCause.EVICTION, detail="notice", decision_seconds=0.5)
    stopping = job("j", JobState.MORPHING, action=Action.STOP, morph=morph, salvage=Salvage(("n",), 4, (0,), 9.0))
    running = move(stopping, JobState.RUNNING, "gen 2", NOW, generation=2, layout=LAYOUT).job
    assert (running.action, running.morph.started_at, running.state_since) == (Action.RUN, None, NOW)
    assert running.morph == replace(morph, started_at=None)  # a path into the morph: the rest of it is kept
    assert running.salvage == Salvage()  # no salvage of the last generation pending


def test_a_move_refuses_missing_and_table_owned_fields() -> None:
    with pytest.raises(IllegalTransition, match="needs job"):
        move(node("n"), NodeState.ASSIGNED, "placed", NOW)
    with pytest.raises(IllegalTransition, match="sets job itself"):
        move(node("n", NodeState.ASSIGNED, job="j"), NodeState.READY, "freed", NOW, job="other")
    with pytest.raises(IllegalTransition, match="only a move sets state_since"):
        move(node("n"), NodeState.LOST, "silent", NOW, state_since=0.0)  # type: ignore[call-overload]
    with pytest.raises(IllegalTransition, match=r"needs morph\.cause"):
        move(job("j", JobState.RUNNING), JobState.MORPHING, "why?", NOW, action=Action.STOP, morph=Morph(detail="-"))
    with pytest.raises(IllegalTransition, match="sets salvage itself"):
        move(
            job("j", JobState.MORPHING), JobState.RUNNING, "gen 2", NOW, generation=2, layout=LAYOUT, salvage=Salvage()
        )


def test_the_typed_keywords_name_every_field_a_move_act_or_amend_may_write() -> None:
    """The TypedDicts the type checker holds callers to, against the records (one may not drift from the other)."""
    naming = {"id", "spec", "submitted_at"}
    writes = {f.name for f in dataclasses.fields(JobRecord)} - naming - JOB_LIFECYCLE.managed()
    assert set(JobFields.__annotations__) == writes
    assert set(MoveFields.__annotations__) == writes | {"action"}
    node_writes = {f.name for f in dataclasses.fields(NodeRecord)} - {"name", "incarnation"} - NODE_LIFECYCLE.managed()
    assert set(NodeFields.__annotations__) == node_writes


def test_amend_changes_other_fields_but_never_the_state() -> None:
    assert amend(node("n", NodeState.DRAINING, job="j"), job=None).node.job is None
    assert amend(job("j"), step=7).job.step == 7 and amend(job("j"), step=7).change is None
    for managed in ("state", "state_since"):
        with pytest.raises(IllegalTransition, match="only a move"):
            amend(node("n"), **{managed: NodeState.GONE})  # type: ignore[call-overload]
    with pytest.raises(IllegalTransition, match="only a move sets reason"):
        amend(job("j"), reason="sneaky")  # type: ignore[call-overload]


def _state_writes(path: Path) -> list[int]:
    """Lines of ``path`` that build a record with a new ``state`` by ``replace(..., state=...)``."""
    tree = ast.parse(path.read_text())
    return [
        call.lineno
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", getattr(call.func, "attr", "")) == "replace"
        and any(k.arg == "state" for k in call.keywords)
    ]


def test_nothing_but_changes_writes_a_state() -> None:
    offenders = {
        str(path.relative_to(REPO)): lines
        for path in (REPO / "controller").rglob("*.py")
        if path.name != "changes.py" and (lines := _state_writes(path))
    }
    assert offenders == {}
