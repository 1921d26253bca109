"""Spot GPUs shared by the scheduler's grants, end to end on a local cluster (issue 49: "GPUs shared across jobs
by value").

A job of priority 0 trains on both VMs; a job of priority 5 arrives. The scheduler moves GPUs to it where the
weighted gain over the horizon pays both morphs: the running job is shrunk (``JobShrunk``, morph cause ``shrunk``)
onto the VM it keeps, the new job runs on the one given up, both end SUCCEEDED, and the shrunk job loses no step
and ends equal to the single-process reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.eventlog.scheduler_facts import JobShrunk
from spotmorph.local.harness import LocalCluster
from spotmorph.local.unplanned import pipeline_profile
from worker_agent.contract import CheckpointLoaded, CheckpointWritten, TrainingStopped

from .test_elastic import SHORT_STEPS, assert_equals_reference, submit

pytestmark = pytest.mark.slow


# In `make soak` (about 32 s on 2 cores: two jobs on two VMs of two slots): make test keeps the controller's
# side, stepped with the real planner (tests/controller/test_sharing.py: the shrink, the nodes kept, the step
# written when memory cannot give it, starvation, no growth onto another's grant) and the policy's properties
# (tests/scheduler/test_allocation.py).
@pytest.mark.soak
def test_a_higher_priority_job_takes_gpus_from_a_running_one_which_shrinks_losing_no_step(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=2, slots=2)
    checkpoints = tmp_path / "low"
    low = submit(cluster, checkpoints, SHORT_STEPS)
    cluster.wait_step(low, 10, 120)
    assert len(cluster.job_nodes(low)) == 2, "alone, it takes both VMs"

    high = submit(cluster, tmp_path / "high", 40, priority=5)

    def both_running() -> bool:
        return {cluster.status(high)["state"], cluster.status(low)["state"]} == {"RUNNING"}

    cluster.wait(both_running, 120, "the high-priority job to run beside the shrunk one")
    shrunk = cluster.facts(JobShrunk, low)
    assert len(shrunk) == 1, shrunk
    fact = shrunk[0].fact
    assert fact.for_job == high and fact.cause == "priority" and fact.kept and fact.given_up
    assert set(cluster.job_nodes(high)) == set(fact.given_up)
    assert set(cluster.job_nodes(low)) == set(fact.kept)
    # the VMs given up left at the stop handing over what only they held: the step came from memory, not the disk
    generation = int(cluster.status(low)["generation"])
    records = [r for rs in cluster.progress(low, generation).values() for r in rs]
    loaded = [r.event for r in records if isinstance(r.event, CheckpointLoaded)]
    assert loaded and all(e.checkpoint == f"memory of generation {generation - 1}" for e in loaded), loaded

    done_high = cluster.wait_state(high, {"SUCCEEDED", "FAILED"}, 240)
    assert done_high["state"] == "SUCCEEDED", done_high
    final = cluster.wait_state(low, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    assert final["steps_lost"] == 0
    assert any(m["cause"].startswith("shrunk") for m in final["morphs"]), final["morphs"]
    assert_equals_reference(checkpoints, references, SHORT_STEPS)


@pytest.mark.soak
def test_a_shrunk_pipeline_hands_the_stage_it_gives_up_to_the_vms_it_keeps(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    """Three one-slot VMs each hold a stage of the low-priority job (3 x 1). A higher-priority job takes one: the
    VM given up leaves at the stop (``Assignment.leaving``) and hands its stage to a VM kept, so the shrunk job's
    next generation takes the whole step from memory and the stop writes nothing."""
    cluster.up(nodes=3, slots=1)
    checkpoints = tmp_path / "low"
    profile = pipeline_profile(tmp_path / "pipeline_profile.json")
    low = submit(cluster, checkpoints, SHORT_STEPS, profile=profile, checkpoint_interval=SHORT_STEPS)  # none before
    before = cluster.wait_step(low, 10, 120)
    assert int(before["layout"]["pipeline_stages"]) == 3, before["layout"]
    high = submit(cluster, tmp_path / "high", 40, priority=5)

    def both_running() -> bool:
        return {cluster.status(high)["state"], cluster.status(low)["state"]} == {"RUNNING"}

    cluster.wait(both_running, 120, "the high-priority job to run beside the shrunk one")
    [shrunk] = cluster.facts(JobShrunk, low)
    generation = int(cluster.status(low)["generation"])
    records = [r for rs in cluster.progress(low, generation - 1).values() for r in rs]
    stopped = [r.event for r in records if isinstance(r.event, TrainingStopped)]
    assert len(stopped) == 3, stopped
    held = stopped[0].step
    written = [r.event for r in records if isinstance(r.event, CheckpointWritten) and r.event.step == held]
    assert not written, (
        f"the shrink's stop wrote step {held}: the VM given up ({shrunk.fact.given_up}) did not hand off"
    )
    events = [r.event for rs in cluster.progress(low, generation).values() for r in rs]
    loaded = [e for e in events if isinstance(e, CheckpointLoaded)]
    assert loaded and all(e.step == held and e.checkpoint == f"memory of generation {generation - 1}" for e in loaded)
    final = cluster.wait_state(low, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED" and final["steps_lost"] == 0, final
    assert_equals_reference(checkpoints, references, SHORT_STEPS)
