"""Peer snapshots, pure: where each copy goes, what a node's loss leaves, which step a recovery takes."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from morphing.layout import Layout, Slot, even_partition
from morphing.snapshots import (
    KEPT_SNAPSHOTS,
    SNAPSHOT_BUDGET,
    Holding,
    RecoverySource,
    SnapshotCosts,
    choose_recovery,
    due,
    lonely_stages,
    plan_snapshots,
    settled_interval,
    snapshot_memory,
    snapshot_refusal,
    stages_at,
)


@st.composite
def layouts(draw: st.DrawFn, min_nodes: int = 1) -> Layout:
    stages = draw(st.integers(1, 4))
    replicas = draw(st.integers(1, 3))
    assume(stages * replicas >= min_nodes)
    world = stages * replicas
    nodes = draw(st.integers(min_nodes, max(min_nodes, world)))
    slots = [Slot(f"n{i}", k) for i in range(nodes) for k in range(world)]
    placement = draw(st.permutations(slots))[:world]
    assume(len({s.node for s in placement}) >= min_nodes)
    return Layout(stages, replicas, 1, replicas, even_partition(stages * 2, stages), tuple(placement))


def pipeline(nodes: int, stages: int, replicas: int = 1) -> Layout:
    world = stages * replicas
    per_node = -(-world // nodes)  # contiguous, as the planner places: a replica's stages side by side
    placement = tuple(Slot(f"n{r // per_node}", r % per_node) for r in range(world))
    return Layout(stages, replicas, 1, replicas, even_partition(stages, stages), placement)


def after_loss(layout: Layout, node: str, step: int, received_ok: bool = True) -> dict[int, Holding]:
    """What the survivors of ``node``'s loss hold when the snapshot of ``step`` streamed (``received_ok``)."""
    plan = plan_snapshots(layout)
    out = {}
    for rank, slot in enumerate(layout.placement):
        if slot.node == node:
            continue
        own = frozenset({step}) if plan.active else frozenset()
        got = frozenset({step}) if received_ok and plan.senders_to(rank) else frozenset()
        out[rank] = Holding(live=step + 1, own=own, received=got)
    return out


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_a_snapshot_never_lands_on_the_node_it_protects(layout: Layout) -> None:
    plan = plan_snapshots(layout)
    for route in plan.routes:
        assert layout.placement[route.sender].node != layout.placement[route.receiver].node
        assert layout.coords(route.sender)[1] == route.stage
    assert {r.stage for r in plan.routes} <= set(lonely_stages(layout))
    if len(layout.nodes()) >= 2:
        assert {r.stage for r in plan.routes} == set(lonely_stages(layout)) and not plan.unprotected
    elif lonely_stages(layout):
        assert not plan.routes and "too few nodes" in plan.unprotected


@settings(max_examples=200, deadline=None)
@given(layouts(min_nodes=2), st.data())
def test_one_nodes_loss_leaves_every_stage_somewhere(layout: Layout, data: st.DataObject) -> None:
    node = data.draw(st.sampled_from(layout.nodes()))
    plan = plan_snapshots(layout)
    holdings = after_loss(layout, node, 10)
    recovery = choose_recovery(layout, plan, holdings, 0, 11)
    # the survivors hold live step 11 only where no stage was lost: else the snapshot of step 10 covers it
    assert recovery.source is not RecoverySource.CHECKPOINT, (layout, node, plan)
    assert recovery.steps_lost <= 1
    lost = {layout.coords(r)[1] for r, s in enumerate(layout.placement) if s.node == node}
    survived = {layout.coords(r)[1] for r in holdings}
    if lost <= survived:
        assert recovery.source is RecoverySource.MEMORY and recovery.step == 11


def test_a_three_by_one_pipeline_is_a_ring_and_one_node_says_too_few() -> None:
    plan = plan_snapshots(pipeline(3, 3))
    assert [(r.sender, r.receiver) for r in plan.routes] == [(0, 1), (1, 2), (2, 0)]
    alone = plan_snapshots(pipeline(1, 3))
    assert not alone.active and "too few nodes" in alone.unprotected
    assert not plan_snapshots(pipeline(2, 2, replicas=2)).active  # each stage's replicas on two nodes


def test_a_kill_mid_stream_falls_back_to_the_committed_snapshot_then_the_checkpoint() -> None:
    layout = pipeline(3, 3)
    plan = plan_snapshots(layout)
    # node n2 (stage 2) killed while step 10's snapshot streamed: rank 0 never got stage 2's copy of step 10
    holdings = {
        0: Holding(live=10, own=frozenset({9, 10}), received=frozenset({9})),
        1: Holding(live=10, own=frozenset({9, 10}), received=frozenset({9, 10})),
    }
    assert choose_recovery(layout, plan, holdings, 5, 10).step == 9
    assert choose_recovery(layout, plan, holdings, 5, 10).source is RecoverySource.SNAPSHOT
    assert choose_recovery(layout, plan, holdings, 9, 10).source is RecoverySource.CHECKPOINT
    bare = {r: Holding(live=10) for r in holdings}
    assert choose_recovery(layout, plan, bare, 5, 10) == choose_recovery(layout, plan, bare, 5, 10)
    assert choose_recovery(layout, plan, bare, 5, 10).source is RecoverySource.CHECKPOINT


@settings(max_examples=300, deadline=None)
@given(layouts(), st.data())
def test_the_recovery_is_the_newest_complete_step(layout: Layout, data: st.DataObject) -> None:
    plan = plan_snapshots(layout)
    steps = st.integers(0, 6)
    survivors = data.draw(st.sets(st.integers(0, layout.world_size - 1)))
    holdings = {
        r: Holding(
            data.draw(st.none() | steps),
            frozenset(data.draw(st.sets(steps, max_size=2))),
            frozenset(data.draw(st.sets(steps, max_size=2))),
        )
        for r in sorted(survivors)
    }
    checkpoint = data.draw(steps)
    recovery = choose_recovery(layout, plan, holdings, checkpoint, 7)
    complete = [
        s for s in range(checkpoint + 1, 7) if len(stages_at(layout, plan, holdings, s)) == layout.pipeline_stages
    ]
    assert recovery.step == max(complete, default=checkpoint)
    assert recovery.steps_lost == 7 - recovery.step
    if recovery.source is RecoverySource.MEMORY:  # every stage has a survivor whose live state is that step
        live = {layout.coords(r)[1] for r, h in holdings.items() if h.live == recovery.step}
        assert len(live) == layout.pipeline_stages


@settings(max_examples=100, deadline=None)
@given(layouts(), st.data())
def test_the_memory_counts_both_copies_of_every_kept_snapshot(layout: Layout, data: st.DataObject) -> None:
    sizes = data.draw(st.lists(st.integers(0, 2**30), min_size=layout.pipeline_stages, max_size=layout.pipeline_stages))
    plan = plan_snapshots(layout, sizes)
    per_node = snapshot_memory(layout, plan, sizes)
    assert set(per_node) == set(layout.nodes())
    own = sum(sizes[layout.coords(r)[1]] for r in range(layout.world_size)) if plan.active else 0
    assert sum(per_node.values()) == KEPT_SNAPSHOTS * (own + sum(sizes[r.stage] for r in plan.routes))
    assert snapshot_refusal(per_node, {n: b for n, b in per_node.items()}) == ""
    if any(per_node.values()):
        short = {n: max(0, b - 1) for n, b in per_node.items()}
        assert "peer snapshots need" in snapshot_refusal(per_node, short)


def test_due() -> None:
    assert due(4, 2) and not due(3, 2) and not due(4, 0) and due(7, 1)


@given(
    st.integers(1, 50),
    st.floats(1e-4, 100.0, allow_nan=False),
    st.floats(1e-3, 100.0, allow_nan=False),
)
def test_the_settled_interval_is_the_fewest_steps_at_which_a_snapshot_costs_at_most_five_percent(
    interval: int, cost: float, step: float
) -> None:
    settled = settled_interval(interval, cost, step)
    assert settled >= interval, "never narrower than the job asked"
    assert cost <= SNAPSHOT_BUDGET * settled * step * (1 + 1e-9), "within the budget"
    if settled > interval:
        assert cost > SNAPSHOT_BUDGET * (settled - 1) * step * (1 - 1e-9), "one step fewer would exceed it"


def test_a_snapshot_switched_off_or_not_timed_keeps_the_jobs_interval() -> None:
    assert settled_interval(0, 10.0, 1.0) == 0
    assert settled_interval(3, 0.0, 1.0) == 3
    assert settled_interval(3, 1.0, 0.0) == 3
    assert settled_interval(1, 0.04, 1.0) == 1 and settled_interval(1, 0.06, 1.0) == 2


def test_the_costs_are_ready_after_the_measured_snapshots_and_leave_the_first_step_out() -> None:
    costs = SnapshotCosts().add_step(9.0).add_snapshot(0.2)
    assert not costs.ready
    costs = costs.add_step(1.0).add_step(3.0).add_snapshot(0.4)
    assert costs.ready and costs.figures() == (0.30000000000000004, 2.0)
