"""Chaos on network namespaces: six or more VMs, a seeded schedule of preempt, kill, partition, heal,
netem and add, and a float64 job that must end where an uninterrupted run ends.

The seed comes from ``SPOTMORPH_CHAOS_SEED`` or is drawn at random; it is printed and goes into the
failure report with the faults as they were applied, so a red run is replayed with
``SPOTMORPH_CHAOS_SEED=<seed> pytest tests/e2e/test_netns_chaos.py``. The short variant runs in
``make test``; the long one (more faults, more steps) in ``make soak``.

The job's profile is the demo model's, made compute-bound and given little memory, so the planner uses
a pipeline (P >= 2) with several replicas on six VMs and re-plans the depth as VMs come and go.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from controller.eventlog.facts import GenerationIssued
from spotmorph.local.chaos import ChaosOptions, plan_chaos
from spotmorph.local.chaos_run import ChaosRun
from spotmorph.local.harness import ENDED, LocalCluster, max_rel_diff, train_reference
from spotmorph.local.unplanned import pipeline_profile

from .netns_helpers import needs_netns, unexplained

pytestmark = [pytest.mark.slow, needs_netns]
BATCH, JOB_SEED, INTERVAL = 16, 5, 10


def chaos_seed() -> int:
    return int(os.environ.get("SPOTMORPH_CHAOS_SEED") or random.SystemRandom().randrange(2**31))


def run_chaos(cluster: LocalCluster, tmp_path: Path, references: Path, *, nodes: int, faults: int, steps: int) -> None:
    seed = chaos_seed()
    cluster.notes.append(f"chaos seed {seed}: replay with SPOTMORPH_CHAOS_SEED={seed}")
    print(f"chaos seed {seed}")
    schedule = plan_chaos(seed, ChaosOptions(nodes=nodes, faults=faults, min_healthy=3, max_nodes=nodes + 3))
    cluster.notes.append("schedule:\n" + "\n".join(f.describe() for f in schedule))
    cluster.up(nodes=nodes, slots=1, heartbeat_expiry=4.0, netns=True)
    checkpoints = tmp_path / "ckpt"
    job = cluster.submit(
        steps=steps,
        global_batch=BATCH,
        seed=JOB_SEED,
        dtype="float64",
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
        profile=pipeline_profile(tmp_path / "chaos_profile.json"),
    )
    cluster.wait_step(job, 3, 240)
    run = ChaosRun(cluster, schedule, say=print)
    try:
        result = run.run(stop=lambda: cluster.status(job)["state"] in ENDED)
    finally:
        cluster.notes.append("applied:\n" + run.result().describe())
    final = cluster.wait_state(job, set(ENDED), 900)
    assert final["state"] == "SUCCEEDED", final
    expected = train_reference(references, steps, BATCH, JOB_SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9
    unnoticed = result.unnoticed_losses()
    assert final["steps_lost"] <= INTERVAL * unnoticed, (final["steps_lost"], unnoticed)
    assert not unexplained(final, cluster.facts(GenerationIssued, job))


def test_a_short_chaos_on_four_namespaced_vms(cluster: LocalCluster, tmp_path: Path, references: Path) -> None:
    """make test's chaos: two faults of the seeded schedule on four VMs, the same checks as the long runs."""
    run_chaos(cluster, tmp_path, references, nodes=4, faults=2, steps=80)


# make soak: four faults on six VMs (more of the schedule's kinds at once); make test runs the short one above
@pytest.mark.soak
def test_chaos_on_six_namespaced_vms(cluster: LocalCluster, tmp_path: Path, references: Path) -> None:
    run_chaos(cluster, tmp_path, references, nodes=6, faults=4, steps=150)


@pytest.mark.soak
def test_chaos_soak_on_eight_namespaced_vms(cluster: LocalCluster, tmp_path: Path, references: Path) -> None:
    run_chaos(cluster, tmp_path, references, nodes=8, faults=24, steps=600)
