"""Every QUEUED job says what it waits for, and a job that fits none of the nodes here blocks nobody.

The pure core, stepped by reconcile (``Sim``): reasons are set once and changed only when the wait
changes. With one job live the queue's rule holds (a head that fits the nodes present waits for room); with
several, the scheduler's grants decide (:mod:`controller.core.reconcile.sharing`): a job that fits the cluster
but not the free nodes waits for room while a smaller one runs beside it, and a higher-priority job never
waits while one of lower priority with the same needs runs. A job that fits no layout of the nodes present
(memory, min_gpus, device) waits without blocking anyone or the growth of running jobs.
"""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.lifecycle import JobState
from controller.core.model import JobRecord, SetJob, World
from controller.core.reconcile.waits import WAITS_FOR_ROOM
from morphing.planner import Planner
from morphing.profile import parse_profile
from tests.controller.helpers import job, node, profile_dict
from tests.controller.test_reconcile import Sim

J = JobState


def sim_of(nodes: int, *jobs: JobRecord, slots: int = 1) -> Sim:
    world = World(
        {f"node-{i}": node(f"node-{i}", slots=slots, at=-1.0 + i * 0.001) for i in range(1, nodes + 1)},
        {j.id: j for j in jobs},
    )
    sim = Sim(world)
    for name in sim.world.nodes:
        sim.beat(name)
    return sim


def needing(job_id: str, min_gpus: int, priority: int = 0, at: float = 0.0) -> JobRecord:
    record = job(job_id, priority=priority, at=at)
    return replace(record, spec=record.spec.model_copy(update={"min_gpus": min_gpus}))


def small_gpus(gib_per_gpu_mib: int = 10) -> Planner:
    """A planner whose GPUs hold 10 MiB: the six-layer test model needs a pipeline of at least 3 stages."""
    profile = profile_dict()
    profile["cluster"]["gpu_memory_bytes"] = gib_per_gpu_mib << 20
    return Planner(parse_profile(json.dumps(profile)), 8)


def reasons_said(sim: Sim, job_id: str) -> list[str]:
    return [c.job.reason for c in sim.log if isinstance(c, SetJob) and c.job.id == job_id and c.change]


def test_a_job_whose_profile_fits_no_layout_here_names_the_memory_limit_and_blocks_nobody() -> None:
    sim = sim_of(2, job("big", priority=5), job("small", at=1.0))
    sim.planners["big"] = small_gpus()
    sim.step()
    assert sim.job("small").state is J.RUNNING  # admitted past the head that fits nothing here
    big = sim.job("big")
    assert big.state is J.QUEUED
    assert big.reason.startswith("fits no layout of the 2 node(s) here (2 GPU slots): memory:"), big.reason
    assert "at least 3 stages" in big.reason
    sim.step(1)
    assert reasons_said(sim, "big") == [big.reason]  # said once, not on every pass


def test_a_job_asking_for_more_gpus_than_the_cluster_has_says_so_and_the_next_one_runs() -> None:
    sim = sim_of(2, needing("wide", 5, priority=1), job("narrow", at=1.0))
    sim.step()
    assert sim.job("narrow").state is J.RUNNING
    assert sim.job("wide").reason == ("its best layout on the 2 node(s) here uses 2 GPU(s), fewer than its min_gpus 5")


def test_a_job_that_fits_the_cluster_but_not_the_free_nodes_waits_and_a_smaller_one_runs_beside_it() -> None:
    sim = sim_of(2, needing("first", 2))
    sim.step()
    assert sim.job("first").state is J.RUNNING and len(sim.job("first").nodes) == 2
    added = node("node-3", at=sim.now)
    sim.world = replace(
        sim.world,
        nodes={**sim.world.nodes, "node-3": added},
        jobs={**sim.world.jobs, "second": needing("second", 2, at=1.0), "third": job("third", at=2.0)},
    )
    sim.planners.update({"second": sim.planners["first"], "third": sim.planners["first"]})
    for name in sim.world.nodes:
        sim.beat(name)
    sim.step(1)
    assert sim.job("third").state is J.RUNNING and sim.job("third").nodes == ("node-3",)  # backfilled
    assert sim.job("second").state is J.QUEUED and sim.job("second").reason == WAITS_FOR_ROOM
    assert sim.job("first").state is J.RUNNING and len(sim.job("first").nodes) == 2  # a third GPU adds less


def test_an_unplaceable_queued_job_does_not_stop_a_running_job_from_growing() -> None:
    sim = sim_of(1, job("j1"))
    sim.step(10)
    assert sim.job().state is J.RUNNING and sim.job().nodes == ("node-1",)
    added = node("node-2", at=sim.now)
    stuck = needing("stuck", 50, at=sim.now)
    sim.world = replace(sim.world, nodes={**sim.world.nodes, "node-2": added}, jobs={**sim.world.jobs, "stuck": stuck})
    sim.planners["stuck"] = sim.planners["j1"]
    sim.beat("node-1")
    sim.beat("node-2")
    sim.step(1)
    assert sim.job("stuck").state is J.QUEUED and "min_gpus 50" in sim.job("stuck").reason
    assert sim.job().state is J.MORPHING, sim.job()  # the policy grows it onto node-2


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 4),
    wants=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2)), min_size=1, max_size=5),
)
def test_every_queued_job_has_a_reason_and_none_waits_while_a_lower_one_with_its_needs_runs(
    nodes: int, wants: list[tuple[int, int]]
) -> None:
    jobs = [needing(f"j{i}", gpus, priority, at=float(i)) for i, (gpus, priority) in enumerate(wants)]
    sim = sim_of(nodes, *jobs)
    sim.step()
    for queued in jobs:
        now = sim.job(queued.id)
        fits_cluster = queued.spec.min_gpus <= nodes
        if now.state is J.QUEUED:
            assert now.reason, now
            assert ("min_gpus" in now.reason) == (not fits_cluster), (queued.id, now.reason)
            lower = [
                j.id
                for j in jobs
                if sim.job(j.id).state is J.RUNNING
                and j.spec.min_gpus == queued.spec.min_gpus
                and j.spec.priority < queued.spec.priority
            ]
            assert not lower, (queued.id, lower)
        else:
            assert now.state is J.RUNNING and fits_cluster


def test_a_job_without_a_planner_fails_with_why_and_the_one_behind_it_runs() -> None:
    """The shell hands reconcile an Unplannable (the profile went bad after submit) instead of a planner."""
    from controller.core.causes import JobFailureCause
    from controller.core.reconcile.config import Unplannable

    sim = sim_of(2, job("broken", priority=5), job("fine", at=1.0))
    why = "profile: /p.json is not valid JSON (line 1, column 1: Expecting value)"
    sim.planners["broken"] = Unplannable(why)
    sim.step()
    broken, fine = sim.world.jobs["broken"], sim.world.jobs["fine"]
    assert broken.state is J.FAILED and broken.reason == why, broken
    assert broken.failure_cause is JobFailureCause.UNPLANNABLE
    assert fine.state is J.RUNNING
