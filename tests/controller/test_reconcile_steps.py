"""Reconcile's steps one at a time, on a draft: the fenced report view, health, progress, the morph protocol."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.causes import MorphCause
from controller.core.commands import ReleaseInstance, SetNode
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Action, JobRecord, NodeObservation, RankReport, World
from controller.core.reconcile import Config
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.health import node_health
from controller.core.reconcile.morph import advance_morph
from controller.core.reconcile.progress import progress
from controller.core.reconcile.reports import census, current_reports
from controller.core.records import CheckpointRef, Morph
from tests.controller.helpers import job, node, planner

J, N = JobState, NodeState
NODES = ("node-1", "node-2")
LAYOUT = planner().plan([(name, 2) for name in NODES]).layout  # type: ignore[union-attr]
CONFIG = Config(heartbeat_expiry_seconds=10, lost_to_gone_seconds=60, stop_timeout_seconds=30, abort_timeout_seconds=60)


def running(generation: int = 2, **fields: Any) -> JobRecord:
    return job("j1", J.RUNNING, generation=generation, layout=LAYOUT, **fields)


def draft_of(record: JobRecord, observed: dict[str, NodeObservation], now: float = 100.0) -> Draft:
    nodes = {name: replace(node(name, N.ASSIGNED, 2, "j1"), incarnation=2) for name in NODES}
    return Draft(World(nodes, {record.id: record}, observed), now)


reports = st.builds(
    RankReport,
    job=st.sampled_from(["j1", "j2"]),
    generation=st.integers(1, 3),
    rank=st.integers(0, 3),
    running=st.booleans(),
    exit_code=st.sampled_from([None, 0, 1]),
    last_step=st.integers(0, 120),
    last_checkpoint_step=st.integers(0, 120),
)
observations = st.builds(
    NodeObservation, incarnation=st.integers(1, 2), last_seen=st.floats(0, 100), ranks=st.lists(reports).map(tuple)
)
worlds_observed = st.dictionaries(st.sampled_from(NODES), observations)


@settings(max_examples=100, deadline=None)
@given(worlds_observed)
def test_the_fenced_view_holds_exactly_the_current_incarnation_and_generation(
    observed: dict[str, NodeObservation],
) -> None:
    draft = draft_of(running(), observed)
    expected = [
        (name, r)
        for name in LAYOUT.nodes()
        if name in observed and observed[name].incarnation == 2
        for r in observed[name].ranks
        if (r.job, r.generation) == ("j1", 2)
    ]
    assert list(current_reports(draft, draft.jobs["j1"])) == expected


@settings(max_examples=100, deadline=None)
@given(worlds_observed)
def test_progress_never_goes_back_and_only_fenced_reports_move_it(observed: dict[str, NodeObservation]) -> None:
    before = running(step=50, last_checkpoint=CheckpointRef(40, 1))
    draft = draft_of(before, observed)
    progress(draft, "j1")
    after = draft.jobs["j1"]
    fenced = [r for _, r in current_reports(draft, before)]
    assert after.step == max([50, *(r.last_step for r in fenced)])
    assert after.last_checkpoint.step == max([40, *(r.last_checkpoint_step for r in fenced)])
    assert (after.state, after.generation) == (before.state, before.generation)


@settings(max_examples=100, deadline=None)
@given(worlds_observed)
def test_a_census_counts_only_what_the_current_generation_reported(observed: dict[str, NodeObservation]) -> None:
    record = running()
    counted = census(draft_of(record, observed), record)
    fenced = [r for _, r in current_reports(draft_of(record, observed), record)]
    assert counted.expected == LAYOUT.world_size
    assert counted.done + counted.failed <= len([r for r in fenced if not r.running])
    if any(r.running for r in fenced):
        assert not counted.quiet


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(list(NodeState)),
    st.one_of(st.none(), st.floats(0, 200)),
    st.booleans(),
    st.one_of(st.none(), st.floats(0, 300)),
)
def test_health_follows_heartbeats(
    state: NodeState, heard: float | None, other_incarnation: bool, notice: float | None
) -> None:
    record = replace(
        node("node-1", state, job="j1" if state in {N.ASSIGNED, N.DRAINING, N.LOST} else None), incarnation=2
    )
    observed = {} if heard is None else {"node-1": NodeObservation(1 if other_incarnation else 2, heard, (), notice)}
    draft = Draft(World({"node-1": record}, {}, observed), 100.0)
    node_health(draft, CONFIG)
    after = draft.nodes["node-1"]
    current = heard is not None and not other_incarnation
    heard_lately = current and heard is not None and 100.0 - heard <= 10
    if heard_lately:
        assert after.state not in {N.LOST, N.GONE} or state is after.state
    elif state in {N.READY, N.ASSIGNED}:
        assert after.state in {N.LOST, N.GONE}
    if not current:
        assert after.state is not N.DRAINING or state is N.DRAINING  # another incarnation's notice is not this one's
    released = [c for c in draft.commands if isinstance(c, ReleaseInstance)]
    assert bool(released) == (after.state is N.GONE and state is not N.GONE)
    for command in draft.commands:
        if isinstance(command, SetNode) and command.node.state is N.GONE:
            assert command.node.job is None


def test_a_stop_that_times_out_aborts_and_keeps_its_cause() -> None:
    stopping = replace(
        running(),
        state=J.MORPHING,
        action=Action.STOP,
        morph=Morph(started_at=50.0, cause=MorphCause.EVICTION, detail="eviction notice: node-2"),
    )
    still = tuple(RankReport("j1", 2, r, True, None, 10, 10) for r in range(2))
    observed = {name: NodeObservation(2, 99.0, still) for name in NODES}
    draft = draft_of(stopping, observed, now=81.0)  # 31 s after the STOP: past stop_timeout_seconds
    advance_morph(draft, CONFIG, {"j1": planner()}, "j1")
    after = draft.jobs["j1"]
    assert (after.state, after.action) == (J.MORPHING, Action.ABORT)
    assert (after.morph.cause, after.morph.detail) == (MorphCause.EVICTION, "eviction notice: node-2; stop timed out")
    early = draft_of(stopping, observed, now=79.0)
    advance_morph(early, CONFIG, {"j1": planner()}, "j1")
    assert early.jobs["j1"].action is Action.STOP and early.commands == []
