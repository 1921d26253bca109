"""On-demand capacity for a deadline, end to end on a local cluster (issue 49's "done when").

A job with a deadline and ``on_demand: allowed`` trains on two spot nodes; both are taken away (``local preempt``),
so spot alone no longer meets its deadline: the controller asks its provider (the local one) for on-demand nodes,
with the cause, and the job runs on them; spot nodes return (``local add``), the on-demand nodes are given back and
the job ends SUCCEEDED, equal to the single-process reference.

The scheduler's times are shortened for a job of a minute (``local up --deadline-safety 5 --on-demand-start 10``);
the outlook's step is an hour, longer than the deadline is away, so "the same GPUs arriving a step later still meet
it" never defers the request: with no spot left, any deadline is at risk at once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.eventlog.scheduler_facts import OnDemandReleased, OnDemandRequested
from spotmorph.local.harness import LocalCluster

from .test_elastic import assert_equals_reference, submit

pytestmark = pytest.mark.slow

STEPS = 240
DEADLINE_SECONDS = 1200.0  # far enough for spot alone (two nodes) with margin; with no spot, never met
TIMING = ["--deadline-safety", "5", "--on-demand-start", "10", "--deadline-outlook-step", "3600"]


def pools(cluster: LocalCluster) -> dict[str, str]:
    """Each registered node's pool, as ``spotmorph local vms`` lists it."""
    listed = cluster.cli("local", "vms").stdout.splitlines()
    return {fields[1]: fields[2] for line in listed if len(fields := line.split()) >= 4 and fields[1] != "-"}


# In `make soak` (50 s on 2 cores: four VMs, two preempted, two added): make test keeps the controller's side with a
# live controller (tests/controller/test_scheduler_status.py), the on-demand decisions (tests/controller/
# test_on_demand.py) and the local provider's on-demand VMs (tests/local/test_local_pools.py).
@pytest.mark.soak
def test_a_deadline_at_risk_gets_on_demand_nodes_and_gives_them_back_when_spot_returns(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=2, slots=1, on_demand_nodes=2, deadline_timing=TIMING)
    checkpoints = tmp_path / "ckpt"
    deadline = datetime.fromtimestamp(time.time() + DEADLINE_SECONDS, tz=UTC).isoformat()
    job = submit(cluster, checkpoints, STEPS, deadline=deadline, on_demand="allowed", on_demand_max_gpus=2)
    cluster.wait_step(job, 10, 120)
    spot = cluster.job_nodes(job)
    assert spot and all(pools(cluster)[n] == "spot" for n in spot)
    assert not cluster.facts(OnDemandRequested, job), "spot alone meets the deadline: no on-demand yet"
    held = cluster.status(job)["on_demand"]
    assert held is not None and held["gpus"] == 0 and held["cause"] is None

    taken = min(cluster.preempt(node, 5) for node in spot)  # spot taken away: the deadline is at risk

    def on_demand_running() -> bool:
        status = cluster.status(job)
        nodes = cluster.job_nodes(job)
        kinds = pools(cluster)
        return status["state"] == "RUNNING" and bool(nodes) and all(kinds.get(n) == "on-demand" for n in nodes)

    cluster.wait(on_demand_running, 120, "the job to run on on-demand nodes")
    asked = cluster.facts(OnDemandRequested, job)
    assert asked and asked[0].fact.cause == "deadline_at_risk" and 0 < asked[0].fact.gpus <= 2
    assert asked[0].at >= taken - 1.0  # not before the spot nodes were taken away
    on_demand = cluster.job_nodes(job)
    status = cluster.status(job)
    hold = status["on_demand"]
    assert hold["cause"] == "deadline_at_risk" and sorted(hold["held_nodes"]) == sorted(on_demand)
    running_on_demand_at = int(status["step"])
    cluster.wait_step(job, running_on_demand_at + 5, 120)  # it trains there
    levels = [(f.fact.previous, f.fact.gpus) for f in cluster.facts(OnDemandRequested, job)]
    assert [previous for previous, _ in levels].count(0) == 1, f"the level fell back to 0 and rose again: {levels}"

    cluster.cli("local", "add", "2")  # spot returns: the on-demand nodes are given back
    cluster.wait(lambda: bool(cluster.facts(OnDemandReleased, job)), 120, "the on-demand nodes given back")
    released = cluster.facts(OnDemandReleased, job)[0].fact
    assert released.cause == "spot_returned" and set(released.nodes) == set(on_demand)

    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
    assert final["state"] == "SUCCEEDED", final
    assert any("given back: moving off it" in m["cause"] for m in final["morphs"]), final["morphs"]
    for node in on_demand:
        cluster.wait(lambda node=node: cluster.node_state(node) == "GONE", 60, f"{node} given back")  # type: ignore[misc]
    assert final["on_demand"]["held_gpus"] == 0
    assert_equals_reference(checkpoints, references, STEPS)
