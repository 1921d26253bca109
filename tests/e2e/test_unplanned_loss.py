"""A node killed without notice on a real local cluster: the survivors' last step is salvaged.

Real controller, agents (warm trainers, the default) and trainers; ``local kill`` SIGKILLs a whole VM.
The controller must start the next generation from the step the survivors held, before the heartbeat
expiry (asserted on the order of events and their causes, never on wall-clock times), losing at most
the step in flight, and the final checkpoint must equal an uninterrupted 1-process run (float64, 1e-9).
Through memory (the default) the survivors keep that step and the next generation takes it from them,
writing it in the background; through the disk (``morph_through_memory: false``) writers write it first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from worker_agent.contract import CheckpointLoaded

pytestmark = pytest.mark.slow

STEPS, BATCH, SEED, INTERVAL = 200, 16, 7, 150  # the kill lands near step 30


@pytest.mark.parametrize("path", ["memory", pytest.param("disk", marks=pytest.mark.soak)])
def test_a_node_killed_without_notice_loses_at_most_the_step_in_flight(
    cluster: LocalCluster, tmp_path: Path, references: Path, path: str
) -> None:
    cluster.up(nodes=2, slots=2, heartbeat_expiry=30.0)  # an expiry far beyond what the salvage needs
    checkpoints = tmp_path / "ckpt"
    job = cluster.submit(
        steps=STEPS,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
        morph_through_memory=str(path == "memory").lower(),
    )
    before = cluster.wait_step(job, 30, 180)
    assert int(before["layout"]["data_parallel"]) >= 2, before["layout"]
    assert len(cluster.job_nodes(job)) == 2, "each VM holds a replica of every stage (contiguous placement)"
    victim = cluster.job_nodes(job)[-1]
    cluster.kill(victim)
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    events = cluster.events(job)
    kinds = [e["kind"] for e in events]
    first = kinds.index("CollectiveFailed")
    ended = next(e for e in events if e["kind"] == "SalvageEnded")
    issued = next(
        i for i, e in enumerate(events) if e["kind"] == "GenerationIssued" and int(e["data"]["generation"]) == 2
    )
    lost = [
        i
        for i, e in enumerate(events)
        if e["kind"] == "NodeStateChanged" and e["node"] == victim and e["data"]["to"] == "LOST"
    ]
    assert first < kinds.index("NodesSuspected") < issued
    assert not lost or lost[0] > issued, "the next generation waited for the heartbeat expiry"
    resume_step = int(events[issued]["data"]["resume_step"])
    # What the user reads names the node that died, not the survivor that noticed, on every surface.
    assert events[issued]["data"]["morph_cause"] == "node_lost", events[issued]
    morph = next(m for m in final["morphs"] if m["generation"] == 2)
    assert morph["cause"].startswith(f"{victim} lost without notice; "), morph
    assert f"noticed by {events[first]['node']}" in morph["cause"] and events[first]["node"] != victim, morph
    assert morph["resumed_at_step"] == max(resume_step, int(events[issued]["data"].get("held_step", 0))), morph
    if path == "memory":  # the survivor held a replica of every stage, and no checkpoint is near the kill
        assert ended["data"]["reason"] == "in_memory", ended
        assert "SalvageOrdered" not in kinds, kinds  # nothing written before generation 2
        held = int(ended["data"]["step"])
        assert int(events[issued]["data"]["held_step"]) == held and final["steps_lost"] <= 1
        loads = [
            r.event for rs in cluster.progress(job, 2).values() for r in rs if isinstance(r.event, CheckpointLoaded)
        ]
        assert loads and all(x.step == held and x.checkpoint == "memory of generation 1" for x in loads), loads
        committed = {(e["data"]["generation"], e["data"]["step"]) for e in events if e["kind"] == "CheckpointCommitted"}
        assert any(g == 2 and step >= held for g, step in committed), committed  # generation 2 wrote it (or later)
    elif ended["data"]["reason"] == "committed":
        assert final["steps_lost"] <= 1
        assert resume_step == int(ended["data"]["step"])  # the salvaged step
    else:  # the kill came right after the periodic checkpoint
        assert ended["data"]["reason"] == "already_committed", ended
        assert final["steps_lost"] <= 1
        assert resume_step == int(ended["data"]["resume_step"]) >= int(ended["data"]["step"])
    expected = train_reference(references, STEPS, BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9
