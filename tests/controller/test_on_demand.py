"""The controller's half of the scheduler: on-demand capacity for a deadline at risk, given back when spot
returns; the pools' history persisted; the planner's predictions checked and a slower growth undone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core import capacity
from controller.core.causes import MorphCause
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import ReleaseInstance, SetPoolStats, World, apply
from controller.core.observations import EvictionRisk
from controller.core.reconcile import Config, reconcile
from controller.core.reconcile.devices import may_run_on
from controller.core.records import AtRisk, Learning, NodeRecord, OnDemandHold, Training
from controller.eventlog.scheduler_facts import GrowthUndone, OnDemandReleased, OnDemandRequested, StepTimeChecked
from controller.persistence.store import Store
from scheduler.deadlines import CapacityCause, DeadlineConfig
from scheduler.forecast import PoolStats, observe
from scheduler.policy import SchedulerConfig
from scheduler.pools import PoolKind
from tests.controller.helpers import job, node, planner, spec

DEADLINE = "2030-01-01T00:00:00Z"
AT = spec(deadline=DEADLINE).deadline_seconds() or 0.0


def deadline_job(steps: int, **fields: object) -> object:
    allowed = spec(deadline=DEADLINE, on_demand="allowed", steps=steps)
    return replace(job("j1", **fields), spec=allowed)  # type: ignore[arg-type]


def kinds(commands: Sequence[object]) -> list[type]:
    return [type(getattr(c, "fact", None) or c) for c in commands]


def facts_of(commands: Sequence[object], cls: type) -> list[object]:
    from controller.eventlog.fact import RecordEvent
    from controller.eventlog.schema import decode

    return [f for c in commands if isinstance(c, RecordEvent) and isinstance(f := decode(c.kind, c.data), cls)]


def test_a_deadline_at_risk_on_spot_alone_asks_for_on_demand_with_its_cause_and_numbers() -> None:
    now = AT - 600.0  # ten minutes left: spot alone (one node) cannot do a huge job
    queued = deadline_job(10_000_000)
    world = World({"spot-1": node("spot-1")}, {"j1": queued})  # type: ignore[dict-item]
    commands = reconcile(world, now, Config(), {"j1": planner()})
    asked = facts_of(commands, OnDemandRequested)
    assert asked and asked[0].gpus > 0 and asked[0].cause in {"deadline_at_risk", "last_safe_moment"}  # type: ignore[attr-defined]
    decided = apply(world, commands)
    hold = decided.jobs["j1"].on_demand
    assert hold.gpus == asked[0].gpus and hold.remaining_samples > 0 and hold.deadline_in_seconds == 600.0  # type: ignore[attr-defined]
    ask = capacity.next_ask(decided, now, None, 30.0, PoolKind.ON_DEMAND)
    assert ask is not None and ask.pool is PoolKind.ON_DEMAND and ask.slots == hold.gpus
    assert any(isinstance(c, SetPoolStats) and c.stats.kind is PoolKind.SPOT for c in commands)


def test_no_on_demand_is_asked_for_while_the_spot_nodes_a_deadline_counts_on_are_still_joining() -> None:
    """Seen end to end: a job submitted in a cluster's first second, its two spot VMs registered but not yet
    heard from, asked for two on-demand GPUs at once (spot GPUs: 0). A rise waits for arrivals to settle."""
    now = AT - 1200.0  # twenty minutes left: the two spot nodes finish the small job long before
    joining = {f"spot-{i}": node(f"spot-{i}", NodeState.JOINING, at=now - 0.2) for i in (1, 2)}
    world = World(joining, {"j1": deadline_job(100)})  # type: ignore[dict-item]
    timing = DeadlineConfig(safety_seconds=5.0, on_demand_start_seconds=10.0, outlook_step_seconds=3600.0)
    config = Config(debounce_seconds=5.0, scheduler=SchedulerConfig(deadlines=timing))  # the e2e test's times
    early = reconcile(world, now, config, {"j1": planner()})
    assert not facts_of(early, OnDemandRequested), "the spot nodes are still arriving"
    assert apply(world, early).jobs["j1"].on_demand.gpus == 0
    ready = {name: replace(n, state=NodeState.READY) for name, n in joining.items()}
    settled = reconcile(replace(world, nodes=ready), now + 6.0, config, {"j1": planner()})
    assert not facts_of(settled, OnDemandRequested), "once they are ready, spot alone meets the deadline"
    empty = World({}, {"j1": deadline_job(10_000_000)})  # type: ignore[dict-item]
    alone = reconcile(empty, AT - 600.0, config, {"j1": planner()})
    assert facts_of(alone, OnDemandRequested), "with no spot node arriving, a deadline at risk still asks at once"


def test_an_on_demand_node_serves_its_owner_only_and_is_given_back_when_no_job_needs_it() -> None:
    mine = replace(node("od-1"), pool=PoolKind.ON_DEMAND, owner="j1")
    assert may_run_on(job("j1"), mine) and not may_run_on(job("j2"), mine)
    assert may_run_on(job("j2"), node("spot-1"))
    small = deadline_job(1)  # a job spot alone finishes long before its deadline
    now = AT - 86_400.0
    world = World({"od-1": mine, "spot-1": node("spot-1")}, {"j1": small}, started_at=now)  # type: ignore[dict-item]
    commands = reconcile(world, now, Config(), {"j1": planner()})
    released = facts_of(commands, OnDemandReleased)
    assert released and released[0].nodes == ["od-1"]  # type: ignore[attr-defined]
    assert ReleaseInstance("od-1") in commands
    assert apply(world, commands).nodes["od-1"].state is NodeState.GONE


def test_a_busy_on_demand_node_given_back_moves_its_job_off_it_first() -> None:
    layout = planner().plan([("od-1", 1)]).layout  # type: ignore[union-attr]
    running = deadline_job(1, state=JobState.RUNNING, layout=layout)
    given_back = replace(node("od-1", NodeState.ASSIGNED, job="j1"), pool=PoolKind.ON_DEMAND, owner=None)
    now = AT - 86_400.0
    world = World({"od-1": given_back, "spot-1": node("spot-1")}, {"j1": running}, started_at=now)  # type: ignore[dict-item]
    decided = apply(world, reconcile(world, now, Config(), {"j1": planner()}))
    assert decided.jobs["j1"].morph.cause is MorphCause.ON_DEMAND_RETURNED


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=12))
def test_pool_history_round_trips_through_both_stores_shape(counts: list[int]) -> None:
    stats = PoolStats(PoolKind.SPOT)
    for i, live in enumerate(counts):
        stats = observe(stats, float(i), live, evicted=max(0, stats.live - live))
    assert PoolStats.from_dict(stats.to_dict()) == stats
    assert stats.evictions == sum(max(0, a - b) for a, b in zip([0, *counts], counts, strict=False)) - max(
        0, 0 - counts[0]
    )


def test_the_store_keeps_each_pools_history(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    stats = observe(observe(PoolStats(PoolKind.SPOT), 0.0, 3), 60.0, 2, evicted=1)
    store.persist([SetPoolStats(stats)])
    store.persist([SetPoolStats(replace(stats, live=4))])
    assert store.pools() == {PoolKind.SPOT: replace(stats, live=4)}
    store.close()


def test_a_generation_checks_its_step_time_and_learns_the_correction() -> None:
    plan = planner().plan([("n1", 1), ("n2", 1)])
    layout = plan.layout  # type: ignore[union-attr]
    measured = plan.samples_per_second / 2  # type: ignore[union-attr]  # twice as slow as predicted
    running = job(
        "j1",
        JobState.RUNNING,
        generation=2,
        layout=layout,
        step=10,
        training=Training(step=10, samples_per_second=measured, generation=2),
    )
    nodes = {n: node(n, NodeState.ASSIGNED, job="j1") for n in ("n1", "n2")}
    world = World(nodes, {"j1": running})
    commands = reconcile(world, 5.0, Config(), {"j1": planner()})
    checked = facts_of(commands, StepTimeChecked)
    assert checked and abs(checked[0].error_before - 0.5) < 1e-9 and checked[0].error_after == checked[0].error_before  # type: ignore[attr-defined]
    learned = apply(world, commands).jobs["j1"].learning
    assert learned.checked_generation == 2 and len(learned.observations) == 1
    again = replace(running, generation=3, training=Training(step=10, samples_per_second=measured, generation=3))
    again = replace(again, learning=learned)
    second = facts_of(reconcile(World(nodes, {"j1": again}), 6.0, Config(), {"j1": planner()}), StepTimeChecked)
    assert second and second[0].error_after < 0.05 < second[0].error_before  # type: ignore[attr-defined]


def test_a_growth_that_measured_slower_is_undone_and_its_nodes_avoided() -> None:
    plan = planner().plan([("n1", 1), ("n2", 1)])
    grown = job(
        "j1",
        JobState.RUNNING,
        generation=2,
        layout=plan.layout,  # type: ignore[union-attr]
        step=10,
        training=Training(step=10, samples_per_second=1.0, generation=2),
        learning=Learning(growth_from=5.0, grown_from=("n1",)),
    )
    grown = replace(grown, morph=replace(grown.morph, cause=MorphCause.GROW))
    nodes = {n: node(n, NodeState.ASSIGNED, job="j1") for n in ("n1", "n2")}
    commands = reconcile(World(nodes, {"j1": grown}), 5.0, Config(), {"j1": planner()})
    undone = facts_of(commands, GrowthUndone)
    assert undone and undone[0].nodes == ["n2"]  # type: ignore[attr-defined]
    after = apply(World(nodes, {"j1": grown}), commands).jobs["j1"]
    assert after.morph.cause is MorphCause.GROWTH_UNDONE and after.learning.avoid == (("n2",),)
    assert any(n == "n2" for n, _ in after.exclusions.until)


def waiting_for_on_demand(steps: int, now: float) -> object:
    """A job QUEUED after losing its spot nodes, its level of two on-demand GPUs asked and not arrived yet."""
    hold = OnDemandHold(gpus=2, cause=CapacityCause.DEADLINE_AT_RISK, since=now - 30.0)
    allowed = spec(deadline=DEADLINE, on_demand="allowed", steps=steps, on_demand_max_gpus=2)
    return replace(job("j1"), spec=allowed, on_demand=hold)


def test_a_job_waiting_for_its_on_demand_capacity_keeps_its_level() -> None:
    """The arriving VMs register before the provider's list names their pool (a node no list named counts as
    spot): their GPUs must not talk the job out of the capacity it waits for (2 -> 0 -> 2, asked twice)."""
    now = AT - 3600.0  # spot alone (two nodes) would meet it: a job not waiting for anything would give back
    arriving = {n: node(n, at=now - 20.0) for n in ("vm-1", "vm-2")}
    world = World(arriving, {"j1": waiting_for_on_demand(500, now)}, started_at=now)  # type: ignore[dict-item]
    commands = reconcile(world, now, Config(), {"j1": planner()})
    assert apply(world, commands).jobs["j1"].on_demand.gpus == 2
    assert not facts_of(commands, OnDemandRequested)


def test_an_on_demand_node_still_joining_counts_for_the_level_it_fills() -> None:
    """An owned on-demand node in JOINING is neither pending nor present to the scheduler unless counted: the
    level stays, and no second ask is made for it."""
    now = AT - 3600.0
    joining = {
        n: replace(node(n, NodeState.JOINING, at=now - 5.0), pool=PoolKind.ON_DEMAND, owner="j1")
        for n in ("od-1", "od-2")
    }
    spot = {n: node(n, at=now - 20.0) for n in ("spot-1", "spot-2")}
    world = World({**joining, **spot}, {"j1": waiting_for_on_demand(500, now)}, started_at=now)  # type: ignore[dict-item]
    commands = reconcile(world, now, Config(), {"j1": planner()})
    decided = apply(world, commands)
    assert decided.jobs["j1"].on_demand.gpus == 2
    assert all(decided.nodes[n].owner == "j1" for n in joining)
    assert not facts_of(commands, OnDemandRequested) and not facts_of(commands, OnDemandReleased)


def test_a_vm_the_job_already_runs_on_when_the_list_names_it_on_demand_is_claimed_not_left() -> None:
    """Admitted onto its arriving VMs before the provider's list named their pool, the job keeps them: they fill
    its level (owner), it does not move off them for a given-back node."""
    now = AT - 3600.0
    layout = planner().plan([("vm-1", 1), ("vm-2", 1)]).layout  # type: ignore[union-attr]
    running = replace(waiting_for_on_demand(500, now), state=JobState.RUNNING, layout=layout)  # type: ignore[type-var]
    listed = {
        n: replace(node(n, NodeState.ASSIGNED, job="j1", at=now - 20.0), pool=PoolKind.ON_DEMAND)
        for n in ("vm-1", "vm-2")
    }
    world = World(listed, {"j1": running}, started_at=now)  # type: ignore[dict-item]
    decided = apply(world, reconcile(world, now, Config(), {"j1": planner()}))
    assert all(decided.nodes[n].owner == "j1" for n in listed)
    assert (
        decided.jobs["j1"].morph.cause is not MorphCause.ON_DEMAND_RETURNED and decided.jobs["j1"].on_demand.gpus == 2
    )


ONE_HOUR_OUTLOOK = Config(scheduler=SchedulerConfig(deadlines=DeadlineConfig(outlook_step_seconds=3600.0)))


def on_two_spot_nodes(now: float, second: NodeRecord) -> World:
    """A job on two spot nodes that meet its deadline together, not alone (an hour left, 3750 steps)."""
    layout = planner().plan([("spot-1", 1), ("spot-2", 1)]).layout  # type: ignore[union-attr]
    allowed = spec(deadline=DEADLINE, on_demand="allowed", steps=3750, on_demand_max_gpus=2)
    running = replace(job("j1", JobState.RUNNING, layout=layout, generation=1), spec=allowed)
    first = node("spot-1", NodeState.ASSIGNED, job="j1", at=now - 600.0)
    return World({"spot-1": first, "spot-2": second}, {"j1": running}, started_at=now)


def test_two_spot_nodes_meet_the_deadline_so_nothing_is_asked() -> None:
    now = AT - 3600.0
    world = on_two_spot_nodes(now, node("spot-2", NodeState.ASSIGNED, job="j1", at=now - 600.0))
    assert not facts_of(reconcile(world, now, ONE_HOUR_OUTLOOK, {"j1": planner()}), OnDemandRequested)


def test_a_spot_node_under_eviction_notice_is_not_counted_as_the_jobs_spot_capacity() -> None:
    now = AT - 3600.0
    noticed = replace(node("spot-2", NodeState.DRAINING, job="j1", at=now - 600.0), eviction_not_before=now + 5.0)
    asked = facts_of(
        reconcile(on_two_spot_nodes(now, noticed), now, ONE_HOUR_OUTLOOK, {"j1": planner()}), OnDemandRequested
    )
    assert asked and asked[0].spot_gpus == 1  # type: ignore[attr-defined]


def test_a_spot_node_at_risk_of_eviction_is_not_capacity_the_job_can_rely_on() -> None:
    now = AT - 3600.0
    risky = replace(
        node("spot-2", NodeState.ASSIGNED, job="j1", at=now - 600.0),
        at_risk=AtRisk(EvictionRisk(now - 10.0, "aws-rebalance-recommendation"), now - 10.0),
    )
    asked = facts_of(
        reconcile(on_two_spot_nodes(now, risky), now, ONE_HOUR_OUTLOOK, {"j1": planner()}), OnDemandRequested
    )
    assert asked and asked[0].cause == "deadline_at_risk" and asked[0].spot_gpus == 1  # type: ignore[attr-defined]


def test_a_spot_node_held_out_for_the_job_is_not_spot_capacity_it_can_count_on() -> None:
    """Its peers could not reach spot-2 (an exclusion): the scheduler is told the job may not use it, so the
    job's spot share is one node and its deadline asks for on-demand GPUs."""
    now = AT - 3600.0
    world = on_two_spot_nodes(now, node("spot-2", at=now - 600.0))
    first = world.jobs["j1"]
    layout = planner().plan([("spot-1", 1)]).layout  # type: ignore[union-attr]
    held_out = replace(first, layout=layout, exclusions=replace(first.exclusions, until=(("spot-2", now + 600.0),)))
    world = replace(world, jobs={"j1": held_out})
    asked = facts_of(reconcile(world, now, ONE_HOUR_OUTLOOK, {"j1": planner()}), OnDemandRequested)
    assert asked and asked[0].spot_gpus == 1  # type: ignore[attr-defined]
    free = replace(world, jobs={"j1": replace(held_out, exclusions=first.exclusions)})
    assert not facts_of(reconcile(free, now, ONE_HOUR_OUTLOOK, {"j1": planner()}), OnDemandRequested)
