"""Unplanned losses the just-in-time checkpoint cannot save, on a real local cluster: the job falls back to its
newest periodic checkpoint, the event log says why, and it still ends equal to an uninterrupted run.

Real controller, agents (warm trainers, the default) and trainers; ``local kill`` SIGKILLs whole VMs.

* A whole pipeline stage killed (every VM that runs it): no survivor holds that stage's layers, so the
  controller orders no writer (``SalvageEnded`` reason ``stage_lost``) and the next generation loads the
  newest periodic checkpoint.
* A kill that lands inside the just-in-time write: the writers pause between their layer files and their
  part file (``PAUSE_ENV``, a test-only hook of :mod:`worker_agent.runtime.morph.salvage`), the test kills the
  writer's VM then, and the half-written directory (layer files, no manifest) is never loaded: the
  controller falls back (``writer_failed``) and the next generation loads the newest periodic checkpoint.

Kills are timed from the trainers' progress files (read directly, not through the controller), a few steps
past the next periodic checkpoint from where the trainers are once generation 1 runs (a loaded machine may
take seconds to get there), so the survivors always hold a step newer than it. The final checkpoint must equal
an uninterrupted 1-process run (float64, 1e-9). Events and causes are asserted, never wall-clock times.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.eventlog.facts import (
    GenerationIssued,
    NodesSuspected,
    NodeStateChanged,
    SalvageEnded,
    SalvageOrdered,
)
from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from spotmorph.local.unplanned import (
    DEMO_PROFILE,
    events_of,
    issued,
    kill_nodes,
    pipeline_profile,
    placement,
    salvage_ended,
    stage_nodes,
)
from worker_agent.contract import CheckpointLoaded
from worker_agent.runtime.morph.salvage import PAUSE_ENV

pytestmark = pytest.mark.slow

STEPS, BATCH, SEED, INTERVAL = 200, 16, 7, 40
PAUSE_SECONDS = 20.0  # a writer's pause inside its write: the window for the kill (the deadline is 30 s)
MANIFEST = "manifest.json"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A local cluster whose trainers pause inside every just-in-time write (nothing else is slowed)."""
    local = LocalCluster(tmp_path / "home", {PAUSE_ENV: str(PAUSE_SECONDS)}, poll=0.1)
    try:
        yield local
    finally:
        local.down()


def submit(cluster: LocalCluster, checkpoints: Path, profile: Path = DEMO_PROFILE) -> str:
    return cluster.submit(
        steps=STEPS,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
        profile=profile,
        morph_through_memory="false",  # the just-in-time checkpoint is written before the next generation
    )


def just_past_a_checkpoint(cluster: LocalCluster, job: str) -> dict[str, Any]:
    """Wait until the trainers are a few steps past the next periodic checkpoint and well before the one after;
    returns generation 1's status (its layout), read before: a command takes a while on a loaded machine. The
    trainers' progress files are read directly (milliseconds), so the kill right after lands between two
    checkpoints: the survivors hold a step newer than the newest committed one."""
    status = cluster.status(job)
    assert int(status["generation"]) == 1, status
    boundary = (cluster.steps_reported() // INTERVAL + 1) * INTERVAL
    assert boundary + INTERVAL <= STEPS, f"the trainers are past step {boundary - INTERVAL}: too near the end"
    low, high = boundary + 3, boundary + INTERVAL - 10

    def in_window() -> bool:
        return low <= cluster.steps_reported() <= high

    cluster.wait(in_window, 120, f"the trainers at step {low}..{high}")
    return status


def loaded(cluster: LocalCluster, job: str, generation: int) -> list[CheckpointLoaded]:
    """What every rank of ``generation`` loaded."""
    found = []
    for records in cluster.progress(job, generation).values():
        found += [r.event for r in records if isinstance(r.event, CheckpointLoaded)]
    return found


def assert_resumed_from_the_periodic_checkpoint(cluster: LocalCluster, job: str, ended: SalvageEnded) -> int:
    """Generation 2 was issued with, and its ranks loaded, the newest periodic checkpoint the fallback named."""
    resume = ended.resume_step
    assert resume is not None and resume >= INTERVAL and resume % INTERVAL == 0, ended
    assert issued(cluster, job, 2).resume_step == resume
    loads = loaded(cluster, job, 2)
    assert loads and all(x.step == resume for x in loads), loads
    return resume


def assert_left_out_at_once(cluster: LocalCluster, job: str, killed: list[str]) -> None:
    """Generation 2 runs without the killed VMs and was issued before their heartbeat expiry (none LOST first)."""
    at = next(e.seq for e in events_of(cluster, job, GenerationIssued, 2))
    changes = cluster.facts(NodeStateChanged, job)
    lost = [e.node for e in changes if e.seq < at and e.node in killed and e.fact.target == "LOST"]
    assert not lost, f"generation 2 waited for the heartbeat expiry of {lost}"
    placed = {e.node for e in changes if e.seq > at and e.fact.reason == f"generation 2 of {job}"}
    assert placed and not placed & set(killed), f"generation 2 placed ranks on {placed}, killed: {killed}"


def assert_equals_reference(checkpoints: Path, references: Path) -> None:
    expected = train_reference(references, STEPS, BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9


# make soak; make test: the fallback's decisions in tests/controller/test_salvage.py, a kill in test_unplanned_loss
@pytest.mark.soak
def test_a_whole_stage_killed_falls_back_to_the_newest_periodic_checkpoint(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=4, slots=1, heartbeat_expiry=30.0)  # an expiry far beyond what the fallback needs
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints, pipeline_profile(tmp_path / "pipeline_profile.json"))
    cluster.wait_new_generation(job, 0, 180)
    status = just_past_a_checkpoint(cluster, job)
    layout = status["layout"]
    stages, replicas = int(layout["pipeline_stages"]), int(layout["data_parallel"])
    assert stages >= 2 and replicas >= 2, layout
    victims = stage_nodes(status, stages - 1)  # every replica of the last stage
    cluster.notes.append(f"killed {victims} (stage {stages - 1} of {stages} x {replicas})")
    kill_nodes(cluster, victims)

    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    ended = salvage_ended(cluster, job, 1)
    assert ended.reason == "stage_lost", ended
    assert ended.stages_lost == [stages - 1], ended
    assert not events_of(cluster, job, SalvageOrdered), "a writer was ordered for a stage no survivor holds"
    suspected = events_of(cluster, job, NodesSuspected, 1)
    assert suspected and set(suspected[0].fact.nodes) == set(victims), suspected
    resume = assert_resumed_from_the_periodic_checkpoint(cluster, job, ended)
    assert_left_out_at_once(cluster, job, victims)
    assert final["steps_lost"] > 0, final  # the survivors' held steps past `resume` were given up
    cluster.notes.append(f"resumed from step {resume}")
    assert_equals_reference(checkpoints, references)


@pytest.mark.soak  # make soak; make test: a writer killed mid-salvage in tests/runtime/test_salvage.py
def test_a_kill_during_the_just_in_time_write_never_loads_the_half_written_checkpoint(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=3, slots=1, heartbeat_expiry=30.0)  # the demo profile runs 1 x 2 and leaves one VM free
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints)
    cluster.wait_new_generation(job, 0, 180)
    status = just_past_a_checkpoint(cluster, job)
    nodes = placement(status)
    assert int(status["layout"]["data_parallel"]) >= 2, status["layout"]
    cluster.kill(nodes[-1])  # the highest rank's VM: the survivors hold their step and rank 0 writes it

    def ordered() -> bool:
        return bool(events_of(cluster, job, SalvageOrdered, 1))

    cluster.wait(ordered, 60, "the controller to order the just-in-time checkpoint")
    order = events_of(cluster, job, SalvageOrdered, 1)[0].fact
    held, writers = order.step, order.writers
    half = checkpoints / f"step-{held:08d}-g1"
    layers = sum(last - first for first, last in status["layout"]["detail"]["stage_layers"])
    # The writers wrote every layer file and now pause before their part file: kill them there.
    cluster.wait(lambda: len(list(half.glob("*.pt"))) >= layers, 60, f"the layer files in {half}")
    writer_nodes = sorted({nodes[w] for w in writers})
    cluster.notes.append(f"held step {held}; killed writers {writers} on {writer_nodes} inside their write")
    kill_nodes(cluster, writer_nodes)
    # Read at once: the next generation may clear the half-written directory away once it starts.
    assert len(list(half.glob("*.pt"))) >= layers and not (half / MANIFEST).exists(), "the kill missed the write"

    cluster.wait(lambda: bool(events_of(cluster, job, SalvageEnded, 1)), 60, "the salvage to end")
    ended = salvage_ended(cluster, job, 1)
    assert ended.reason == "writer_failed", ended
    assert set(ended.nodes_gone or ()) == set(writer_nodes), ended
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    resume = assert_resumed_from_the_periodic_checkpoint(cluster, job, ended)
    assert resume < held, (resume, held)
    assert_left_out_at_once(cluster, job, [nodes[-1], *writer_nodes])
    assert not (half / MANIFEST).exists(), "the half-written checkpoint was committed later"
    for generation in range(2, int(final["generation"]) + 1):
        for x in loaded(cluster, job, generation):
            assert Path(x.checkpoint).name != half.name, f"generation {generation} loaded {x.checkpoint}"
    assert_equals_reference(checkpoints, references)
