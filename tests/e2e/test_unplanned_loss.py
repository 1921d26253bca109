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

from controller.core.causes import MorphCause, SalvageOutcome
from controller.eventlog.facts import (
    CheckpointCommitted,
    CollectiveFailed,
    GenerationIssued,
    NodesSuspected,
    NodeStateChanged,
    SalvageEnded,
    SalvageOrdered,
)
from controller.eventlog.schema import logged
from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from worker_agent.contract import CheckpointLoaded

pytestmark = pytest.mark.slow

# The kill lands near step 30; the job's 120 steps after it only have to come (200 before 2026-11-29), and no
# periodic checkpoint comes before its end.
STEPS, BATCH, SEED, INTERVAL = 150, 16, 7, 150


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
    first = logged(events, CollectiveFailed)[0]
    ended = logged(events, SalvageEnded)[0].fact
    issued = next(e for e in logged(events, GenerationIssued) if e.fact.generation == 2)
    lost = [e.seq for e in logged(events, NodeStateChanged) if e.node == victim and e.fact.target == "LOST"]
    assert first.seq < logged(events, NodesSuspected)[0].seq < issued.seq
    assert not lost or lost[0] > issued.seq, "the next generation waited for the heartbeat expiry"
    resume_step = issued.fact.resume_step
    # What the user reads names the node that died, not the survivor that noticed, on every surface.
    assert issued.fact.morph_cause == MorphCause.NODE_LOST, issued
    morph = next(m for m in final["morphs"] if m["generation"] == 2)
    assert morph["cause"].startswith(f"{victim} lost without notice; "), morph
    assert f"noticed by {first.node}" in morph["cause"] and first.node != victim, morph
    assert morph["resumed_at_step"] == issued.fact.resumed_at_step, morph
    if path == "memory":  # the survivor held a replica of every stage, and no checkpoint is near the kill
        assert ended.reason == SalvageOutcome.IN_MEMORY, ended
        assert not logged(events, SalvageOrdered)  # nothing written before generation 2
        held = ended.step
        assert held is not None and issued.fact.held_step == held and final["steps_lost"] <= 1
        loads = [
            r.event for rs in cluster.progress(job, 2).values() for r in rs if isinstance(r.event, CheckpointLoaded)
        ]
        assert loads and all(x.step == held and x.checkpoint == "memory of generation 1" for x in loads), loads
        committed = {(e.fact.generation, e.fact.step) for e in logged(events, CheckpointCommitted)}
        assert any(g == 2 and step >= held for g, step in committed), committed  # generation 2 wrote it (or later)
    elif ended.reason == SalvageOutcome.COMMITTED:
        assert final["steps_lost"] <= 1
        assert resume_step == ended.step  # the salvaged step
    else:  # the kill came right after the periodic checkpoint
        assert ended.reason == SalvageOutcome.ALREADY_COMMITTED, ended
        assert final["steps_lost"] <= 1
        assert ended.step is not None and resume_step == ended.resume_step and resume_step >= ended.step
    expected = train_reference(references, STEPS, BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9
