"""The controller runs a job's layout by liveput (scheduler.layouts.steadiest): in a calm pool the planner's
fastest, in a pool whose history says nodes go often the layout whose likely loss keeps its stage partition,
saying why in the generation's reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from controller.core.lifecycle import JobState
from controller.core.model import World
from morphing.planner import Planner
from morphing.profile import parse_profile
from scheduler.forecast import PoolStats
from scheduler.pools import PoolKind
from tests.controller.helpers import job, node
from tests.controller.test_reconcile import Sim

GPT48 = parse_profile((Path(__file__).parents[2] / "examples" / "profiles" / "gpt48.json").read_text())
HOUR = 3600.0


def admitted(pool: PoolStats) -> tuple[int, int, str]:
    record = job("big")
    record = replace(record, spec=record.spec.model_copy(update={"global_batch": 512}))
    nodes = {f"vm-{i:02}": node(f"vm-{i:02}", at=-1.0 + i * 0.001) for i in range(16)}
    sim = Sim(World(nodes, {"big": record}, pools={PoolKind.SPOT: pool}))
    sim.planners["big"] = Planner(GPT48, 512)
    for name in nodes:
        sim.beat(name)
    sim.step()
    big = sim.job("big")
    assert big.state is JobState.RUNNING and big.layout is not None
    return big.layout.pipeline_stages, big.layout.data_parallel, big.reason


def test_in_a_calm_pool_the_job_runs_the_planners_fastest() -> None:
    calm = PoolStats(PoolKind.SPOT, evictions=0.0, up_seconds=1000 * HOUR, peak=16, live=16, at=-1.0)
    stages, replicas, reason = admitted(calm)
    assert (stages, replicas) == (8, 2) and "liveput" not in reason


def test_where_nodes_go_often_it_runs_the_layout_whose_loss_keeps_its_partition() -> None:
    stormy = PoolStats(PoolKind.SPOT, evictions=120.0, up_seconds=100 * HOUR, arrivals=120.0, empty_seconds=84 * HOUR,
                       peak=16, live=16, at=-1.0)  # fmt: skip
    stages, replicas, reason = admitted(stormy)
    assert (stages, replicas) == (7, 2)
    assert (
        "liveput: 7x2 (P x D)" in reason and "over the fastest 8x2" in reason and "keeps its stage partition" in reason
    )
