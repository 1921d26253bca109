"""Elastic training end to end on a real local cluster, each run checked against a 1-process reference.

The demo model trains in float64; every test ends by comparing the final checkpoint with an
uninterrupted single-process run: max relative error <= 1e-9.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from spotmorph.local.harness import TINY_GPT_SPEC, LocalCluster, max_rel_diff, train_reference, world_size
from spotmorph.local.processes import alive
from worker_agent.contract import read_progress

from .netns_helpers import REASON as NETNS_REASON

pytestmark = pytest.mark.slow

# Where namespaces can be made, tests/e2e/test_netns_training.py preempts with notice and grows onto an
# added VM across real namespaces (no step lost, equal to the reference): these two run in `make soak` there.
SOAK_WHERE_NETNS = pytest.mark.soak if NETNS_REASON is None else pytest.mark.slow

STEPS, BATCH, SEED, INTERVAL = 300, 16, 7, 20
# The runs of `make test` check what happens early (a controller killed at step 30); the job's end only has to
# come: half the soak runs' steps, and one reference for both (tests/e2e/test_local_cluster.py too).
SHORT_STEPS = 150


def submit(cluster: LocalCluster, checkpoints: Path, steps: int = STEPS, **more: object) -> str:
    """The float64 demo job the e2e tests hold to the 1-process reference; ``more``: its other fields (or others
    than these)."""
    fields = {"global_batch": BATCH, "seed": SEED, "dtype": "float64", "checkpoint_interval": INTERVAL}
    return cluster.submit(TINY_GPT_SPEC, **{**fields, "steps": steps, "checkpoint_dir": checkpoints, **more})


def assert_equals_reference(checkpoints: Path, references: Path, steps: int = STEPS) -> None:
    expected = train_reference(references, steps, BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9


@SOAK_WHERE_NETNS
def test_eviction_with_notice_loses_no_step(cluster: LocalCluster, tmp_path: Path, references: Path) -> None:
    cluster.up(nodes=2)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints)
    before = cluster.wait_step(job, 40, 120)
    victim = cluster.job_nodes(job)[-1]
    cluster.cli("local", "preempt", victim, "--notice", "20")
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
    assert final["state"] == "SUCCEEDED", final
    assert final["steps_lost"] == 0
    assert final["generation"] >= 2
    assert final["layout"] != before["layout"]
    assert any("eviction" in m["cause"] for m in final["morphs"])
    cluster.wait(lambda: cluster.node_state(victim) == "GONE", 60, f"{victim} gone")
    assert_equals_reference(checkpoints, references)


# In `make soak`: tests/e2e/test_unplanned_loss.py kills a node without notice (at most the step in flight
# lost) and tests/e2e/test_salvage_fallback.py falls back to the newest periodic checkpoint.
@pytest.mark.soak
def test_node_killed_without_notice_resumes_from_the_newest_checkpoint(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=2)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints)
    cluster.wait_step(job, 50, 120)
    victim = cluster.job_nodes(job)[-1]
    cluster.cli("local", "kill", victim)
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    assert final["generation"] >= 2
    assert 0 <= final["steps_lost"] <= INTERVAL
    assert any("lost" in m["cause"] or "failed" in m["cause"] for m in final["morphs"])
    assert_equals_reference(checkpoints, references)


@SOAK_WHERE_NETNS
def test_added_nodes_grow_the_job_after_the_debounce(cluster: LocalCluster, tmp_path: Path, references: Path) -> None:
    """Growth pays off only for a job with enough work left, so this one is long and is cancelled.

    A 300-step job finishes on a quiet machine before a morph would repay itself, and the policy
    rightly keeps it where it is; here the job would run for hours, it grows, trains on in the new
    layout, is cancelled, and its newest checkpoint must equal a single-process run to that step.
    """
    cluster.up(nodes=1)
    checkpoints = tmp_path / "ckpt"
    job = cluster.submit(
        steps=1_000_000,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
    )
    before = cluster.wait_step(job, 20, 120)
    cluster.cli("local", "add", "1")
    width_before = world_size(before)

    def bigger(status: dict[str, Any]) -> bool:
        return status["state"] == "RUNNING" and world_size(status) > width_before

    grown = cluster.wait_status(job, bigger, 180, "growth onto the new node")
    assert any(m["cause"].startswith("grow") for m in grown["morphs"])
    assert grown["steps_lost"] == 0
    cluster.wait_step(job, int(grown["step"]) + 2 * INTERVAL, 180)
    cluster.cli("cancel", job)
    assert cluster.wait_state(job, {"CANCELLED"}, 60)["state"] == "CANCELLED"
    cluster.wait_released(job)
    verified = json.loads(cluster.cli("checkpoint", "verify", str(checkpoints), "--json").stdout)
    assert verified["step"] > int(grown["step"]), "no checkpoint was written in the grown layout"
    expected = train_reference(references, int(verified["step"]), BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9, f"at step {verified['step']}"


# make soak; make test: tests/controller/test_kill9.py kills the controller -9 while running and while morphing
@pytest.mark.soak
def test_controller_kill_9_mid_training(cluster: LocalCluster, tmp_path: Path, references: Path) -> None:
    cluster.up(nodes=2)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints, SHORT_STEPS)
    cluster.wait_step(job, 30, 120)
    cluster.kill_controller()
    at_kill = cluster.steps_reported()
    cluster.wait(lambda: cluster.steps_reported() >= at_kill + 20, 60, "training to go on without a controller")
    cluster.start_controller()
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
    assert final["state"] == "SUCCEEDED", final
    assert final["steps_lost"] == 0
    assert final["generation"] == 1, "a controller restart is not a morph"
    assert_equals_reference(checkpoints, references, SHORT_STEPS)


# In `make soak` (76 s here): tests/e2e/test_split_brain.py's new-incarnation test checks the same fence on
# every make test, with the agent's session frozen instead of restarted.
@pytest.mark.soak
def test_restarted_agent_never_lets_old_trainers_join(cluster: LocalCluster, tmp_path: Path, references: Path) -> None:
    cluster.up(nodes=2)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints)
    cluster.wait_step(job, 30, 120)
    victim = cluster.job_nodes(job)[-1]
    vm = cluster.vm_of(victim)
    first_generation = [d for d in vm.work_dir.trainers.generation_dirs() if d.generation == 1]
    old_trainers = [int(p.read_text()) for d in first_generation for p in d.pid_files().values()]
    assert old_trainers and all(alive(pid) for pid in old_trainers)
    assert vm.pid is not None
    os.kill(vm.pid, signal.SIGKILL)
    cluster.start_agent(vm)

    def new_incarnation() -> bool:
        return any(n["name"] == victim and n.get("incarnation", 1) >= 2 for n in cluster.nodes())

    cluster.wait(new_incarnation, 60, f"{victim} to register a new incarnation")
    cluster.wait(lambda: not any(alive(pid) for pid in old_trainers), 30, "the old trainers to be gone")
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    assert final["generation"] >= 2
    for directory in first_generation:
        for path in directory.progress_files().values():
            assert {r.generation for r in read_progress(path)} <= {1}
    assert_equals_reference(checkpoints, references)
