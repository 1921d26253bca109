"""Status says why a job holds on-demand capacity (its cause and the numbers behind it, the GPUs it holds and
their cost so far) and how far the planner's step time was off before and after the online correction: the pure
view, the wire, ``spotmorph status`` (and ``--json``), the metrics, and GetJob/GetClusterState on a real
controller."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest

from controller.api import wire
from controller.client.commands.common import job_dict
from controller.client.commands.status import on_demand_lines
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import World
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.on_demand import give_back
from controller.core.records import JobRecord, Learning, NodeRecord, OnDemandHold
from controller.core.scheduler_status import on_demand_status, step_time_status
from controller.observability.metrics import render
from controller.shell.latency import BOUNDS
from controller.shell.views import LatencySnapshot, MetricsSnapshot
from protos.spotmorph.v1 import controller_pb2 as pb
from scheduler.deadlines import CapacityCause
from scheduler.pools import PoolKind
from tests.controller.conftest import Live
from tests.controller.helpers import job, node, spec
from tests.controller.test_contract import spec as wire_spec
from tests.controller.test_hostile_edge import Node
from tests.controller.test_metrics import parse

DEADLINE = "2030-01-01T00:00:00Z"
AT = spec(deadline=DEADLINE).deadline_seconds() or 0.0
PRICE = 4.0


def holding(**hold: Any) -> JobRecord:
    record = job("j1", JobState.RUNNING, step=40)
    allowed = spec(deadline=DEADLINE, on_demand="allowed", steps=100)
    return replace(record, spec=allowed, on_demand=OnDemandHold(**hold))


def on_demand_node(name: str, owner: str | None, joined: float, slots: int = 2) -> NodeRecord:
    return replace(
        node(name, NodeState.ASSIGNED, slots=slots, job=owner, at=joined), pool=PoolKind.ON_DEMAND, owner=owner
    )


def test_the_hold_says_its_cause_numbers_and_the_cost_of_the_nodes_held_now() -> None:
    record = holding(
        gpus=4,
        cause=CapacityCause.DEADLINE_AT_RISK,
        since=AT - 7200.0,
        spot_gpus=1,
        spot_samples_per_second=2.0,
        with_on_demand_samples_per_second=9.0,
        finish_seconds=240.0,
    )
    now = AT - 3600.0
    nodes = [
        on_demand_node("od-2", "j1", now - 1800.0),  # 2 GPUs for half an hour
        on_demand_node("od-1", "j1", now - 3600.0),  # 2 GPUs for an hour
        on_demand_node("od-3", None, now - 3600.0),  # given back: not its cost any more
        replace(node("spot-1", NodeState.ASSIGNED, job="j1"), pool=PoolKind.SPOT),
        replace(on_demand_node("od-4", "j1", now - 60.0), state=NodeState.GONE),  # gone: neither held nor paid
    ]
    status = on_demand_status(record, nodes, now, PRICE)
    assert status is not None
    assert (status.gpus, status.cause, status.held_gpus, status.held_nodes) == (
        4,
        CapacityCause.DEADLINE_AT_RISK,
        4,
        ("od-1", "od-2"),
    )
    assert status.cost_dollars == pytest.approx((2 * 1.0 + 2 * 0.5) * PRICE)
    assert status.deadline_in_seconds == 3600.0  # as of now, not of the decision
    assert status.remaining_samples == 60 * 8  # 60 steps of 8 samples left
    assert (status.spot_gpus, status.spot_samples_per_second, status.finish_seconds) == (1, 2.0, 240.0)


def test_the_cost_in_all_counts_the_nodes_given_back_from_each_ones_join_to_its_give_back() -> None:
    """Reconcile gives back od-1 (2 GPUs joined an hour ago) then od-2 (2 GPUs, half an hour): both stay in the
    job's cost in all, at the price status is asked with; the cost of the nodes held now falls to 0."""

    now = AT - 3600.0
    nodes = {"od-1": on_demand_node("od-1", "j1", now - 3600.0), "od-2": on_demand_node("od-2", "j1", now - 1800.0)}
    draft = Draft(World(nodes, {"j1": holding(gpus=4, cause=CapacityCause.DEADLINE_AT_RISK)}), now)
    give_back(draft, "j1", ("od-1",), "spot_returned")
    draft.now += 600.0
    give_back(draft, "j1", ("od-2",), "spot_returned")
    assert draft.jobs["j1"].on_demand.returned_gpu_seconds == 2 * 3600.0 + 2 * 2400.0
    status = on_demand_status(draft.jobs["j1"], draft.nodes.values(), draft.now, PRICE)
    assert status is not None and status.held_nodes == () and status.cost_dollars == 0.0
    assert status.spent_dollars == pytest.approx((2 * 1.0 + 2 * 2400 / 3600) * PRICE)
    shown = job_dict(pb.Job.FromString(wire.job_to_pb(draft.jobs["j1"], (), status).SerializeToString()))
    assert shown["on_demand"]["spent_dollars"] == pytest.approx(status.spent_dollars)
    assert f"on-demand capacity in all: ${status.spent_dollars:.2f}" in "\n".join(on_demand_lines(shown))


def test_a_job_that_may_use_no_on_demand_and_holds_none_shows_none() -> None:
    plain = job("j1", JobState.RUNNING)
    assert on_demand_status(plain, [], 0.0, PRICE) is None
    never = replace(plain, spec=spec(deadline=DEADLINE, on_demand="never"))
    assert on_demand_status(never, [], 0.0, PRICE) is None
    allowed = on_demand_status(replace(plain, spec=spec(deadline=DEADLINE, on_demand="allowed")), [], 0.0, PRICE)
    assert allowed is not None and allowed.gpus == 0 and allowed.cause is None and allowed.cost_dollars == 0.0


def test_status_and_its_json_say_the_cause_the_numbers_the_cost_and_the_prediction_error() -> None:
    record = holding(gpus=2, cause=CapacityCause.LAST_SAFE_MOMENT, since=AT - 100.0, spot_samples_per_second=1.5)
    record = replace(
        record, learning=Learning(((2, 1.0, 1.5),), checked_generation=3, error_before=0.5, error_after=0.1)
    )
    now = AT - 3600.0
    status = on_demand_status(record, [on_demand_node("od-1", "j1", now - 900.0)], now, PRICE)
    message = pb.Job.FromString(wire.job_to_pb(record, (), status).SerializeToString())
    shown = job_dict(message)
    hold, checked = shown["on_demand"], shown["step_time"]
    assert hold["cause"] == "last_safe_moment" and hold["gpus"] == 2 and hold["held_nodes"] == ["od-1"]
    assert hold["cost_dollars"] == pytest.approx(2 * 0.25 * PRICE) and hold["gpu_hour_price"] == PRICE
    assert hold["deadline_in_seconds"] == 3600.0 and hold["finish_seconds"] is None
    assert checked == {"generation": 3, "checks": 1, "error_before": 0.5, "error_after": 0.1}
    text = "\n".join(on_demand_lines(shown))
    assert "last_safe_moment" in text and "od-1: $2.00 so far at $4.00/GPU-hour" in text
    assert "deadline in 3600 s" in text and "done never" in text
    assert "step time predicted 50% off, 10% after the correction" in text
    bare = job_dict(pb.Job.FromString(wire.job_to_pb(job("j2")).SerializeToString()))
    assert bare["on_demand"] is None and bare["step_time"] is None and on_demand_lines(bare) == []
    assert step_time_status(job("j2")) is None


def test_metrics_say_why_on_demand_is_held_what_it_costs_and_the_prediction_error() -> None:
    record = holding(gpus=3, cause=CapacityCause.DEADLINE_AT_RISK, spot_samples_per_second=1.25)
    record = replace(record, learning=Learning(checked_generation=2, error_before=0.4, error_after=0.05))
    now = AT - 600.0
    status = on_demand_status(record, [on_demand_node("od-1", "j1", now - 3600.0, slots=3)], now, PRICE)
    assert status is not None
    snapshot = MetricsSnapshot(
        now=now,
        nodes=(),
        jobs=(record, job("j2")),
        generations=(),
        event_counts=MappingProxyType({}),
        heartbeat_latency=LatencySnapshot((0,) * len(BOUNDS), 0, 0.0),
        on_demand=MappingProxyType({"j1": status}),
    )
    samples = parse(render(snapshot).decode())
    assert samples["spotmorph_job_on_demand_gpus"] == {(("cause", "deadline_at_risk"), ("job", "j1")): 3.0}
    assert samples["spotmorph_job_on_demand_held_gpus"] == {(("job", "j1"),): 3.0}
    assert samples["spotmorph_job_on_demand_cost_dollars"][(("job", "j1"),)] == pytest.approx(3 * PRICE)
    assert samples["spotmorph_job_deadline_seconds"] == {(("job", "j1"),): 600.0}
    assert samples["spotmorph_job_spot_samples_per_second"] == {(("job", "j1"),): 1.25}
    errors = samples["spotmorph_job_step_time_error"]
    assert errors == {(("correction", "before"), ("job", "j1")): 0.4, (("correction", "after"), ("job", "j1")): 0.05}


def test_get_job_and_cluster_state_say_why_a_job_at_risk_holds_on_demand(live: Live) -> None:
    """One spot node and a deadline ten minutes away for a job of ten million steps: at risk on spot alone, so
    the scheduler wants on-demand GPUs for it (the static provider has none to give: held 0)."""
    soon = datetime.fromtimestamp(time.time() + 600.0, tz=UTC).isoformat()
    fields = {"steps": 10_000_000, "deadline": soon, "on_demand": "allowed", "on_demand_max_gpus": 2}
    job_id = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=wire_spec(live, **fields))).id
    other = wire_spec(live, name="plain", checkpoint_dir=str(live.state_dir / "plain"))
    plain = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=other)).id
    Node(live).beat()
    deadline = time.monotonic() + 10.0
    found = live.jobs().GetJob(pb.GetJobRequest(id=job_id))
    while found.on_demand.gpus == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        found = live.jobs().GetJob(pb.GetJobRequest(id=job_id))
    assert found.HasField("on_demand"), live.event_log()
    hold = found.on_demand
    assert 0 < hold.gpus <= 2 and hold.cause in {"deadline_at_risk", "last_safe_moment"}, live.event_log()
    assert hold.held_gpus == 0 and hold.cost_dollars == 0.0 and 0 < hold.deadline_in_seconds <= 600.0
    assert hold.remaining_samples > 0 and hold.gpu_hour_price == 3.0  # the default price
    assert not live.jobs().GetJob(pb.GetJobRequest(id=plain)).HasField("on_demand")
    state = live.cluster().GetClusterState(pb.GetClusterStateRequest())
    listed = {j.id: j for j in state.jobs}
    assert listed[job_id].on_demand.cause == hold.cause and not listed[plain].HasField("on_demand")
    assert [n.pool for n in state.nodes] == ["spot"] and state.nodes[0].owner == ""
    samples = parse(live.scrape())
    assert samples["spotmorph_job_on_demand_gpus"][(("cause", hold.cause), ("job", job_id))] == hold.gpus
