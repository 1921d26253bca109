"""The invariants every decided world keeps: each one caught when broken, naming itself (the simulations,
which run the check after every step, show that every world they reach keeps them all)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core import intake
from controller.core.changes import JOB_ENTERING
from controller.core.invariants import Invariant, InvariantViolated, check, violations
from controller.core.lifecycle import ACTION_TRANSITIONS, JOB_STATE_ACTIONS, Action, JobState, NodeState
from controller.core.model import JobRecord, RankReport, World, apply
from controller.core.reconcile import Config, assignment_for
from controller.core.records import CheckpointRef, Salvage
from morphing.layout import Slot
from tests.controller.helpers import node, planner, spec
from tests.controller.test_reconcile import Sim, cluster, started
from tests.controller.test_salvage import holds, ranks
from tests.controller.test_salvage import running as salvaging

A, J, N = Action, JobState, NodeState
Breaking = Callable[[World], World]


def _job(world: World, job_id: str = "j1", **fields: object) -> World:
    return replace(world, jobs={**world.jobs, job_id: replace(world.jobs[job_id], **fields)})  # type: ignore[arg-type]


def _node(world: World, name: str, **fields: object) -> World:
    return replace(world, nodes={**world.nodes, name: replace(world.nodes[name], **fields)})  # type: ignore[arg-type]


def _first(world: World) -> str:
    return world.jobs["j1"].nodes[0]


def _placed(world: World, rank: int, slot: Slot) -> World:
    layout = world.jobs["j1"].layout
    assert layout is not None
    placement = list(layout.placement)
    placement[rank] = slot
    return _job(world, layout=replace(layout, placement=tuple(placement)))


def _twin(world: World) -> World:
    """A second running job on the same slots (its nodes hold the first)."""
    return replace(world, jobs={**world.jobs, "j2": replace(world.jobs["j1"], id="j2")})


def _dropped(world: World, name: str) -> World:
    return replace(world, nodes={k: v for k, v in world.nodes.items() if k != name})


RUNNING_WORLD: dict[str, tuple[Breaking, Invariant, str]] = {
    "running-told-to-stop": (
        lambda w: _job(w, action=A.STOP),
        Invariant.STATE_ACTION,
        "job j1 is RUNNING but its trainers are told STOP",
    ),
    "morphing-told-to-run": (
        lambda w: _job(w, state=J.MORPHING),
        Invariant.STATE_ACTION,
        "job j1 is MORPHING but its trainers are told RUN",
    ),
    "running-without-layout": (lambda w: _job(w, layout=None), Invariant.ACTIVE_LAYOUT, "is RUNNING without a layout"),
    "node-released": (
        lambda w: _node(w, _first(w), state=N.READY, job=None),
        Invariant.RUNNING_PLACEMENT,
        "which does not hold it",
    ),
    "node-lost": (lambda w: _node(w, _first(w), state=N.LOST), Invariant.RUNNING_PLACEMENT, "which is LOST"),
    "node-forgotten": (lambda w: _dropped(w, _first(w)), Invariant.RUNNING_PLACEMENT, "which does not exist"),
    "slot-past-the-node": (
        lambda w: _placed(w, 0, Slot(_first(w), 5)),
        Invariant.SLOT_RANGE,
        "is on slot 5 of node-1, which has 1",
    ),
    "two-jobs-one-slot": (
        _twin,
        Invariant.ONE_RANK_PER_SLOT,
        "node-1 slot 0 runs rank 0 of job j1 and rank 0 of job j2",
    ),
    "ready-holds-job": (
        lambda w: _node(w, _first(w), state=N.READY),
        Invariant.NODE_HOLDS,
        "is READY but holds job j1",
    ),
    "unknown-job": (
        lambda w: _node(w, _first(w), job="ghost"),
        Invariant.NODE_HOLDS,
        "holds job ghost, which does not",
    ),
    "finished-holds-node": (
        lambda w: _job(w, state=J.SUCCEEDED),
        Invariant.NODE_HOLDS,
        "still holds job j1, which is SUCCEEDED",
    ),
    "assigned-holds-nothing": (
        lambda w: _node(w, "node-4", state=N.ASSIGNED),
        Invariant.NODE_HOLDS,
        "node-4 is ASSIGNED but holds no job",
    ),
    "held-by-a-job-placing-nothing-there": (
        lambda w: _node(w, "node-4", state=N.ASSIGNED, job="j1"),
        Invariant.NODE_HOLDS,
        "node-4 holds job j1, whose generation 1 places no rank on it",
    ),
    "running-with-a-salvage": (
        lambda w: _job(w, salvage=Salvage(suspected=("node-2",))),
        Invariant.SALVAGE_FIELDS,
        "j1 is RUNNING with a salvage left",
    ),
    "held-step-of-another-generation": (
        lambda w: _job(w, held=CheckpointRef(7, 1)),
        Invariant.HELD_GENERATION,
        "holds step 7 of generation 1, not of an earlier generation",
    ),
    "held-generation-without-a-step": (
        lambda w: _job(w, held=CheckpointRef(0, 3)),
        Invariant.HELD_GENERATION,
        "holds no step but names generation 3",
    ),
}


@pytest.mark.parametrize("breaking", sorted(RUNNING_WORLD))
def test_each_invariant_of_a_running_world_is_caught_naming_itself(breaking: str) -> None:
    sim = started(3)  # j1 runs on node-1 and node-2 (a 1 x 2 layout), node-3 free
    sim.world = replace(sim.world, nodes={**sim.world.nodes, "node-4": node("node-4")})
    assert violations(sim.world) == []
    make, invariant, words = RUNNING_WORLD[breaking]
    broken = make(sim.world)
    assert invariant in {v.invariant for v in violations(broken)}, violations(broken)
    with pytest.raises(InvariantViolated, match=rf"\[{invariant}\] .*{words}") as caught:
        check(broken)
    assert invariant in {v.invariant for v in caught.value.found}


def _holding() -> Sim:
    """A 2 x 2 job whose salvage ordered writers (0, 3) for step 42 (tests/controller/test_salvage.py)."""
    sim = salvaging()
    for name in ("node-1", "node-3", "node-4"):
        holds(sim, name, 42)
    sim.step(0.1)
    sim.step(2.0)
    job = sim.job()
    assert (job.action, job.salvage.step, job.salvage.writers) == (A.HOLD, 42, (0, 3))
    return sim


HOLD_WORLD: dict[str, tuple[Breaking, Invariant, str]] = {
    "writers-without-a-deadline": (
        lambda w: _job(w, salvage=replace(w.jobs["j1"].salvage, deadline=0.0)),
        Invariant.SALVAGE_FIELDS,
        "writers \\(0, 3\\) and deadline disagree",
    ),
    "writers-while-stopping": (
        lambda w: _job(w, action=A.STOP),
        Invariant.SALVAGE_FIELDS,
        "names salvage writers \\(0, 3\\) while told STOP",
    ),
    "a-step-without-writers": (
        lambda w: _job(w, salvage=replace(w.jobs["j1"].salvage, writers=(), deadline=0.0)),
        Invariant.SALVAGE_FIELDS,
        "holds with salvage step 42 and writers \\(\\)",
    ),
    "two-writers-of-one-stage": (
        lambda w: _job(w, salvage=replace(w.jobs["j1"].salvage, writers=(0, 2))),
        Invariant.SALVAGE_FIELDS,
        "writers \\(0, 2\\) are not one rank of each stage",
    ),
    "queued-while-holding": (
        lambda w: _job(w, state=J.QUEUED),
        Invariant.STATE_ACTION,
        "job j1 is QUEUED but its trainers are told HOLD",
    ),
    "succeeded-while-holding": (
        lambda w: _job(w, state=J.SUCCEEDED),
        Invariant.STATE_ACTION,
        "job j1 is SUCCEEDED but its trainers are told HOLD",
    ),
}


@pytest.mark.parametrize("breaking", sorted(HOLD_WORLD))
def test_each_invariant_of_a_salvage_is_caught_naming_itself(breaking: str) -> None:
    world = _holding().world
    assert violations(world) == []
    make, invariant, words = HOLD_WORLD[breaking]
    with pytest.raises(InvariantViolated, match=rf"\[{invariant}\] .*{words}"):
        check(make(world))


def test_a_salvage_that_ended_keeps_its_writers_under_abort_which_is_no_violation() -> None:
    """Why the salvage's writers may outlive HOLD: a committed salvage acts ABORT and leaves them (nothing reads
    them then: an assignment carries a salvage only while HOLD)."""
    sim = _holding()
    sim.beat("node-1", *ranks(sim, "node-1", 42, running=False, exit_code=0, last_checkpoint_step=42))
    sim.step(0.2)  # checks every invariant
    job = sim.job()
    assert (job.state, job.action, job.salvage.writers) == (J.MORPHING, A.ABORT, (0, 3))
    order = assignment_for(sim.world, "node-4")
    assert order is not None and order.salvage is None


def test_a_step_may_not_take_a_generation_back_or_a_job_out_of_a_final_state() -> None:
    world = started(2).world
    job = world.jobs["j1"]
    back = replace(world, jobs={"j1": replace(job, generation=0)})
    assert "job j1's generation went back from 1 to 0" in {v.detail for v in violations(back, world)}
    done = replace(world, jobs={"j1": replace(job, state=JobState.CANCELLED)}, nodes={})
    again = replace(done, jobs={"j1": replace(job, state=JobState.QUEUED)})
    assert [str(v) for v in violations(again, done)] == ["[final-state] job j1 left CANCELLED for QUEUED"]


def test_the_state_action_table_agrees_with_the_lifecycles() -> None:
    """RUNNING only with the RUN its entering sets; MORPHING with each action a morph can name (never RUN)."""
    table = {(state, action) for state, action in JOB_STATE_ACTIONS}
    assert {a for s, a in table if s is J.RUNNING} == {JOB_ENTERING[J.RUNNING].sets["action"]}
    assert {a for s, a in table if s is J.MORPHING} == {b for a, b in ACTION_TRANSITIONS if a is A.RUN}
    assert {s for s, _ in table} == set(JobState)


def test_a_queued_job_keeps_its_old_layout_while_another_job_runs_on_those_slots() -> None:
    """Why slots are claimed by active jobs only: a morph that finds no layout queues its job with the layout of
    its last generation, whose nodes the next job in the queue may then take (a reachable world)."""
    wide = JobRecord("a", spec(priority=1, min_gpus=2), J.QUEUED, submitted_at=0.0, state_since=0.0)
    narrow = JobRecord("b", spec(checkpoint_dir="/tmp/b"), J.QUEUED, submitted_at=1.0, state_since=1.0)
    sim = Sim(cluster(2, wide, narrow))
    sim.planners = {"a": planner(), "b": planner()}
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step()
    assert (sim.job("a").state, sim.job("b").state) == (J.RUNNING, J.QUEUED)
    old = sim.job("a").layout
    sim.step(5)
    sim.beat("node-1")  # node-2 went silent; node-1 keeps beating and its rank exits once told ABORT
    sim.step(6)
    assert sim.job("a").state is J.MORPHING
    a = assignment_for(sim.world, "node-1")
    assert a is not None
    sim.beat("node-1", *[RankReport("a", a.generation, r, False, 1, 0, 0) for r in a.ranks])
    sim.step(1)  # every world stepped through was checked
    assert (sim.job("a").state, sim.job("b").state) == (J.QUEUED, J.RUNNING)
    assert old is not None and sim.job("a").layout == old
    b_layout = sim.job("b").layout
    assert b_layout is not None and set(old.placement) & set(b_layout.placement)


MOVES = ["beat", "notice", "silence", "return", "collective", "exit0", "fail", "finish"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(MOVES), st.integers(1, 4), st.integers(1, 3)), max_size=40))
def test_histories_with_salvages_and_nodes_returning_with_other_slots_keep_every_invariant(
    script: list[tuple[str, int, int]],
) -> None:
    """Two-slot nodes, collectives that fail (salvages kept in memory or written), nodes that go silent, and agents
    that register again as a new incarnation with another slot count: every world reached keeps every invariant
    (Sim.step checks)."""
    nodes = {f"node-{i}": replace(node(f"node-{i}", slots=2), joined_at=-1.0 + i * 0.001) for i in range(1, 5)}
    jobs = [
        JobRecord(j, spec(priority=p, checkpoint_dir=f"/tmp/{j}", morph_through_memory=bool(p)), J.QUEUED, p, p)
        for j, p in (("a", 1), ("b", 0))
    ]  # b's salvages write their step
    config = Config(heartbeat_expiry_seconds=10, debounce_seconds=0, lost_to_gone_seconds=20, morph_cost_seconds=1)
    sim = Sim(World(nodes, {j.id: j for j in jobs}), config)
    silent: set[str] = set()
    for move, k, slots in script:
        name = f"node-{k}"
        if move == "silence":
            silent.add(name)
        if move == "return":  # its agent (re)starts: a new incarnation, maybe of other slots
            silent.discard(name)
            _, commands = intake.register(sim.world, name, slots, "127.0.0.1", sim.now)
            sim.world = apply(sim.world, commands)
        for other, record in sim.world.nodes.items():
            if other in silent or record.state is N.GONE:
                continue
            sim.beat(other, *_reports(sim, other, move if other == name else "beat"), notice=None)
            if move == "notice" and other == name:
                sim.beat(other, *_reports(sim, other, "beat"), notice=sim.now + 30)
        sim.step(3)


def _reports(sim: Sim, name: str, move: str) -> tuple[RankReport, ...]:
    a = assignment_for(sim.world, name)
    if a is None:
        return ()
    running = move not in {"exit0", "fail", "finish"} and a.action not in {A.STOP, A.ABORT}
    code = None if running else (1 if move == "fail" else 0)
    last = 100 if move == "finish" else 10
    held = 10 if move == "collective" or (a.action is A.HOLD and running) else None
    return tuple(RankReport(a.job, a.generation, r, running, code, last, 5, held_step=held) for r in a.ranks)
