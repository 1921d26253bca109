"""The allocation's properties: no GPU twice, never more than present, priorities respected, no starvation."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.allocation import ShareConfig, ShrinkCause, share
from scheduler.deadlines import DeadlineConfig
from scheduler.forecast import Rates
from scheduler.jobs import Grant, JobView, Node
from scheduler.policy import SchedulerConfig, decide
from scheduler.pools import PoolKind

from .strategies import curves, eligibility, holdings, jobs, spot_nodes

SPOT = Rates(1e-5, 1e-3)


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_no_gpu_given_twice_nor_more_than_present(data: st.DataObject) -> None:
    nodes = data.draw(spot_nodes())
    views = data.draw(holdings(data.draw(jobs()), nodes))
    decision = decide(views, nodes, SPOT, now=0.0)
    per_node: dict[str, int] = {}
    for grant in decision.grants:
        assert grant.gpus > 0
        per_node[grant.node] = per_node.get(grant.node, 0) + grant.gpus
    size = {n.name: n.gpus for n in nodes}
    for node, gpus in per_node.items():
        assert node in size, f"{node} is not present"
        assert gpus <= size[node]
    for job in views:
        assert decision.gpus(job.name) <= job.max_gpus
    assert sum(per_node.values()) <= sum(size.values())


@settings(max_examples=150, deadline=None)
@given(curves(), st.integers(0, 30), st.integers(0, 3), st.integers(1, 3))
def test_a_higher_priority_job_gets_at_least_what_a_lower_one_gets(
    curve: tuple[float, ...], capacity: int, low: int, gap: int
) -> None:
    lo = JobView("lo", curve, 1e6, priority=low)
    hi = JobView("hi", curve, 1e6, priority=low + gap)
    demand = {"lo": lo.max_gpus, "hi": hi.max_gpus}
    counts, _ = share([lo, hi], capacity, {}, demand)
    assert counts["hi"] >= counts["lo"]
    assert counts["hi"] + counts["lo"] <= capacity
    if capacity >= (hi.min_gpus or 0):
        assert counts["hi"] >= (hi.min_gpus or 0)


def test_a_running_job_is_shrunk_only_when_the_gain_pays_for_the_morphs() -> None:
    curve = tuple(float(n) for n in range(9))
    lo = JobView("lo", curve, 1e6, priority=0, running_seconds=7200.0)
    hi = JobView("hi", curve, 1e6, priority=1, morph_cost_seconds=3000.0)
    config = ShareConfig(horizon_seconds=3600.0)
    counts, shrinks = share([lo, hi], 8, {"lo": 4, "hi": 4}, {"lo": 8, "hi": 8}, config)
    assert counts == {"lo": 4, "hi": 4} and not shrinks, "hi's morph eats most of the horizon: no shrink"
    counts, shrinks = share([lo, replace(hi, morph_cost_seconds=15.0)], 8, {"lo": 4, "hi": 4}, {"lo": 8, "hi": 8})
    assert counts["hi"] > 4 and shrinks and shrinks[0].cause is ShrinkCause.PRIORITY and shrinks[0].job == "lo"
    fresh = replace(lo, running_seconds=60.0)
    counts, _ = share([fresh, replace(hi, morph_cost_seconds=15.0)], 8, {"lo": 8}, {"lo": 8, "hi": 8}, config)
    assert counts["lo"] > 0, "a job just started is not stopped for priority (it may have starved)"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=4), st.integers(2, 8))
def test_no_job_starves(priorities: list[int], need: int) -> None:
    """Every job needs all the GPUs: none waits longer than starvation_seconds + (n - 1) * min_run_seconds."""
    config = ShareConfig(starvation_seconds=7200.0)
    curve = (0.0,) * need + (10.0,)
    views = [JobView(f"j{i}", curve, 1e9, priority=p) for i, p in enumerate(priorities)]
    held: dict[str, int] = {}
    longest = {v.name: 0.0 for v in views}
    tick = 600.0
    for _ in range(100):
        counts, _ = share(views, need, held, {v.name: need for v in views}, config)
        assert sum(counts.values()) <= need
        views = [
            replace(
                v,
                waited_seconds=0.0 if counts[v.name] else v.waited_seconds + tick,
                running_seconds=v.running_seconds + tick if counts[v.name] else 0.0,
            )
            for v in views
        ]
        for v in views:
            longest[v.name] = max(longest[v.name], v.waited_seconds)
        held = counts
    bound = config.starvation_seconds + (len(views) - 1) * config.min_run_seconds + tick
    assert max(longest.values()) <= bound
    assert all(v.waited_seconds <= bound for v in views)


def test_on_demand_nodes_serve_only_their_owner() -> None:
    curve = (0.0, 1.0, 2.0, 3.0, 4.0)
    a = JobView("a", curve, 1e6, deadline=3600.0)
    b = JobView("b", curve, 1e6)
    nodes = [Node("od-1", PoolKind.ON_DEMAND, 4, owner="a"), Node("s", PoolKind.SPOT, 4)]
    decision = decide([a, b], nodes, SPOT, now=0.0)
    assert {g.node for g in decision.grants if g.job == "b"} <= {"s"}


def test_spot_gpus_go_where_they_make_on_demand_ones_run() -> None:
    """Two jobs of one priority, the same curve (nothing below 7 GPUs); ``topped`` holds 5 on-demand GPUs. Two
    spot GPUs let it run; counted from zero (the earlier sharing), the 2 spot GPUs are worth nothing to either."""
    curve = (0.0,) * 7 + tuple(10.0 * n for n in range(7, 13))
    topped, bare = JobView("topped", curve, 1e6), JobView("bare", curve, 1e6)
    counts, _ = share([topped, bare], 2, {}, {"topped": 7, "bare": 12}, ShareConfig(), {"topped": 5})
    assert counts == {"topped": 2, "bare": 0}
    plain, _ = share([topped, bare], 2, {}, {"topped": 7, "bare": 12}, ShareConfig())
    assert plain["topped"] == 0


def test_decide_tops_up_the_job_holding_on_demand_gpus() -> None:
    curve = (0.0,) * 7 + tuple(10.0 * n for n in range(7, 13))
    od = Node("od-1", PoolKind.ON_DEMAND, 5, owner="topped")
    held = (Grant("topped", "od-1", PoolKind.ON_DEMAND, 5),)
    topped = JobView("topped", curve, 70.0 * 3600, deadline=2 * 3600.0, held=held)  # keeps its 5 on-demand
    bare = JobView("bare", curve, 1e6, submitted_at=-1.0)
    nodes = [od, Node("s0", PoolKind.SPOT, 1), Node("s1", PoolKind.SPOT, 1)]
    decision = decide([bare, topped], nodes, SPOT, now=0.0)
    assert decision.gpus("topped", PoolKind.ON_DEMAND) == 5
    assert decision.gpus("topped", PoolKind.SPOT) == 2 and decision.gpus("bare") == 0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_grant_never_lands_on_a_node_the_job_may_not_use(data: st.DataObject) -> None:
    nodes = data.draw(spot_nodes())
    owned = data.draw(st.lists(st.sampled_from(["j0", "j1", "j2"]), max_size=2))
    nodes += [Node(f"od{i}", PoolKind.ON_DEMAND, 2, owner=owner) for i, owner in enumerate(owned)]
    views = data.draw(eligibility(data.draw(holdings(data.draw(jobs()), nodes)), nodes))
    decision = decide(views, nodes, SPOT, now=0.0)
    by_name = {v.name: v for v in views}
    size = {n.name: n.gpus for n in nodes}
    per_node: dict[str, int] = {}
    for grant in decision.grants:
        assert by_name[grant.job].may_use(grant.node), (grant, by_name[grant.job].eligible_nodes)
        per_node[grant.node] = per_node.get(grant.node, 0) + grant.gpus
    assert all(gpus <= size[node] for node, gpus in per_node.items())
    for view in views:
        assert decision.gpus(view.name) <= view.max_gpus


def test_the_job_that_may_use_one_node_gets_it_and_the_other_takes_the_rest() -> None:
    curve = (0.0, 10.0, 20.0, 30.0, 40.0)
    narrow = JobView("narrow", curve, 1e6, priority=1, eligible_nodes=frozenset({"a"}))  # demand capped at a's 2
    wide = JobView("wide", curve, 1e6)  # placed first by its order, it would take a (most free, then by name)
    nodes = [Node("a", PoolKind.SPOT, 2), Node("b", PoolKind.SPOT, 2)]
    decision = decide([wide, narrow], nodes, SPOT, now=0.0)
    assert {(g.job, g.node) for g in decision.grants} == {("narrow", "a"), ("wide", "b")}
    excluded = JobView("excluded", curve, 1e6, eligible_nodes=frozenset())
    assert decide([excluded, wide], nodes, SPOT, now=0.0).gpus("wide") == 4
    assert decide([excluded], nodes, SPOT, now=0.0).grants == ()


def test_spot_gpus_a_job_may_not_use_do_not_meet_its_deadline() -> None:
    """Eight spot GPUs meet its deadline; the one node of them it may use does not: it asks for on-demand GPUs."""
    curve = (0.0, *(100.0 * n for n in range(1, 9)))
    nodes = [Node(f"s{i}", PoolKind.SPOT, 1) for i in range(8)]
    job = JobView("j", curve, 400.0 * 3600, deadline=2 * 3600.0)  # 4 GPUs' worth for the hour before a margin
    now = SchedulerConfig(deadlines=DeadlineConfig(defer=False))  # asked now, not just in time
    assert not decide([job], nodes, SPOT, 0.0, now).capacity
    narrow = replace(job, eligible_nodes=frozenset({"s0"}))
    decision = decide([narrow], nodes, SPOT, 0.0, now)
    assert decision.capacity and decision.capacity[0].gpus > 0
    assert {g.node for g in decision.grants} == {"s0"}
