"""A 3 x 1 pipeline (one rank a VM) killed without notice on a real local cluster: a peer snapshot saves it.

Real controller, agents and trainers; ``cluster.kill`` SIGKILLs the VM of the last stage, the only copy of that
stage's live state. Every step each rank copied its stage and streamed it to the rank on the next VM (a ring,
``morphing.snapshots``), so the survivors hold the lost stage's copy: the controller ends the salvage from the
snapshot (``SalvageEnded``: source ``snapshot``, steps lost), the next generation (2 x 1 on the two survivors)
takes the lost stage from the survivor that kept its copy, at most one step is lost, and the final checkpoint
equals an uninterrupted 1-process run (float64, 1e-9). Without snapshots the same kill falls back to the
checkpoint (tests/e2e/test_salvage_fallback.py). Events and causes are asserted, never wall-clock times.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.eventlog.facts import GenerationIssued, SalvageEnded
from controller.eventlog.schema import logged
from spotmorph.local.harness import LocalCluster, checkpoint_diff, max_rel_diff, train_reference
from spotmorph.local.unplanned import pipeline_profile, placement
from worker_agent.contract import CheckpointLoaded

pytestmark = pytest.mark.slow

STEPS, BATCH, SEED, INTERVAL = 40, 16, 7, 100  # no periodic checkpoint before the kill (near step 12)
EXACT_BATCH, MICRO = 14, 2


# make soak: exact mode (float32) through the same kill, bitwise; make test: the float64 run, and the exchange from
# a snapshot bit for bit in tests/runtime/test_snapshots.py
@pytest.mark.parametrize("mode", ["float64", pytest.param("exact", marks=pytest.mark.soak)])
def test_a_pipeline_stage_killed_without_notice_comes_back_from_its_peer_snapshot(
    cluster: LocalCluster, tmp_path: Path, references: Path, mode: str
) -> None:
    cluster.up(nodes=3, slots=1, heartbeat_expiry=30.0)  # an expiry far beyond what the salvage needs
    checkpoints = tmp_path / "ckpt"
    exact: dict[str, str | int] = {
        "dtype": "float32",
        "exact": "true",
        "micro_batch_size": MICRO,
        "global_batch": EXACT_BATCH,
    }
    job = cluster.submit(
        steps=STEPS,
        seed=SEED,
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
        profile=pipeline_profile(tmp_path / "pipeline_profile.json"),  # memory-short: 3 x 1 on three VMs
        # every step, whatever it costs on a loaded machine (a widened interval may lose more than one step)
        snapshot_interval_adapts="false",
        **(exact if mode == "exact" else {"dtype": "float64", "global_batch": BATCH}),
    )
    status = cluster.wait_step(job, 12, 180)
    layout = status["layout"]
    assert (int(layout["pipeline_stages"]), int(layout["data_parallel"])) == (3, 1), layout
    victim = placement(status)[-1]  # the last stage's only rank
    cluster.kill(victim)
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
    assert final["state"] == "SUCCEEDED", final
    events = cluster.events(job)
    ended = next(e.fact for e in logged(events, SalvageEnded) if e.fact.generation == 1)
    assert (ended.reason, ended.source) == ("in_memory", "snapshot"), ended
    assert ended.step is not None and ended.steps_lost is not None and ended.steps_lost <= 1, ended
    issued = next(e.fact for e in logged(events, GenerationIssued) if e.fact.generation == 2)
    assert issued.held_step == ended.step and final["steps_lost"] <= 1, (issued, final)
    loads = [r.event for rs in cluster.progress(job, 2).values() for r in rs if isinstance(r.event, CheckpointLoaded)]
    assert loads and all(x.step == ended.step and x.checkpoint == "memory of generation 1" for x in loads), loads
    if mode == "exact":
        expected = train_reference(references, STEPS, EXACT_BATCH, SEED, exact_micro_batch=MICRO)
        verdict = checkpoint_diff(expected, checkpoints)
        assert verdict["verdict"] == "agree" and verdict["not_bitwise"] == [], verdict
        return
    expected = train_reference(references, STEPS, BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9
