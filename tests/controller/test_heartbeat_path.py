"""The heartbeat hot path: no database write for a beat that changes nothing, one reconcile for a burst
of changes, remembered plans, and the server-side latency histogram."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from controller.core import intake as agents
from controller.core.lifecycle import NodeState
from controller.core.model import Command, NodeObservation, World, ranks_by_node
from controller.core.reconcile import Config
from controller.persistence.store import Store
from controller.providers.base import StaticProvider
from controller.shell.latency import BOUNDS, Histogram, quantile
from controller.shell.runner import MemoPlanner, Runner
from morphing.planner import Plan
from morphing.profile import parse_profile
from protos.spotmorph.v1 import controller_pb2 as pb
from scheduler.jobs import throughput_curve
from tests.controller.conftest import Live
from tests.controller.helpers import FakeClock, planner, profile_dict


def test_histogram_quantiles_are_bucket_upper_bounds() -> None:
    h = Histogram()
    assert quantile(h.counts, 0.99) is None
    for _ in range(98):
        h.record(0.001)
    h.record(0.050)
    h.record(1e9)  # beyond the last bucket: counted in it
    assert h.count == 100 and h.counts[-1] == 1
    p50, p99 = quantile(h.counts, 0.50), quantile(h.counts, 0.99)
    assert p50 is not None and 0.001 <= p50 < 0.001 * 1.13
    assert p99 is not None and 0.050 <= p99 < 0.050 * 1.13
    assert quantile(h.counts, 1.0) == BOUNDS[-1]


def test_steady_heartbeats_write_nothing_and_show_in_the_histogram(live: Live) -> None:
    agent = live.agent(live.agent_token())
    reg = agent.Register(pb.RegisterRequest(slots=1, address="127.0.0.1"))
    node = live.agent(reg.node_token)
    beat = pb.HeartbeatRequest(node_name=reg.node_name, incarnation=reg.incarnation)
    node.Heartbeat(beat)  # JOINING -> READY: a change of state, written
    cluster = live.cluster("reader")
    before = cluster.GetClusterState(pb.GetClusterStateRequest()).heartbeat_latency
    wal = live.state_dir / "state.db-wal"
    events, size = len(live.controller.store.events(limit=10_000)), wal.stat().st_size
    for _ in range(20):
        node.Heartbeat(beat)
    assert len(live.controller.store.events(limit=10_000)) == events
    assert wal.stat().st_size == size, "a heartbeat that changes nothing must not write to the database"
    after = cluster.GetClusterState(pb.GetClusterStateRequest()).heartbeat_latency
    assert after.count == before.count + 20 and sum(after.bucket_counts) == after.count
    assert len(after.bucket_upper_seconds) == len(after.bucket_counts) == len(BOUNDS)


def test_a_burst_of_state_changes_is_decided_in_one_reconcile(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        store = Store(tmp_path / "state.db")
        runner = Runner(store, clock, Config(), StaticProvider())
        runner.coalesce_seconds = 0.0
        try:
            for i in range(50):

                def join(world: World, now: float, name: str = f"n{i}") -> list[Command]:
                    return agents.register(world, name, 1, "h", now)[1]

                await runner.decide(join)
            before = runner.reconciles
            await asyncio.gather(*(runner.observe(f"n{i}", NodeObservation(1, clock.now())) for i in range(50)))
            assert runner.reconciles == before + 1
            assert all(n.state is NodeState.READY for n in runner.nodes.values())  # each reply saw its change
            persisted, _ = store.load()
            assert all(n.state is NodeState.READY for n in persisted.values())  # persisted before the replies
            clock.at += 1.0
            await runner.observe("n0", NodeObservation(1, clock.now()))  # nothing changed: no reconcile
            assert runner.reconciles == before + 1
        finally:
            store.close()

    asyncio.run(scenario())


def test_memo_planner_gives_the_planners_answers_once() -> None:
    memo = MemoPlanner(parse_profile(json.dumps(profile_dict())), 8)
    nodes = [(f"n{i}", 1) for i in range(6)]
    first = memo.plan(nodes)
    assert memo.plan(list(nodes)) is first  # remembered
    assert first == planner(8).plan(nodes)  # and the same answer the planner gives
    assert isinstance(first, Plan)
    assert memo.evaluate(first.layout) is memo.evaluate(first.layout)
    placement = first.layout.placement
    assert ranks_by_node(first.layout) == {
        n: tuple(r for r, s in enumerate(placement) if s.node == n) for n in first.layout.nodes()
    }


def test_memo_planner_sweeps_a_throughput_curve_once_per_count_and_node_size() -> None:
    """The scheduler's curve (a what-if sweep) is asked every pass: answered once, the same as the planner's."""
    memo = MemoPlanner(parse_profile(json.dumps(profile_dict())), 8)
    first = throughput_curve(memo, 16, 2)
    assert first == throughput_curve(planner(8), 16, 2)
    swept = memo.what_if(16, 2)
    assert all(a is b for a, b in zip(swept, memo.what_if(16, 2), strict=True))  # remembered, not swept again
