"""A planned morph through memory on a real local cluster: the trainers of generation g stop, keep their
layers and take the ranks of g+1 on the same processes; the layers a rank lacks come from its peers over
gloo, the checkpoint of the step is written in the background afterwards, and the result equals an
uninterrupted single-process run (float64, <= 1e-9). An eviction with notice of a VM that holds a pipeline
stage no one else holds: the leaving rank hands that stage to a rank that stays at the stop, nothing is
written on the critical path, and the next generation starts from memory."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from controller.core.reconcile.config import Config
from controller.core.reconcile.generation import rendezvous_port
from controller.eventlog.facts import CheckpointCommitted
from controller.tokens import Tokens, token_secret
from spotmorph.local.harness import TINY_GPT_SPEC, LocalCluster, max_rel_diff, train_reference, world_size
from spotmorph.local.unplanned import issued, pipeline_profile, stage_nodes
from worker_agent.contract import CheckpointLoaded, CheckpointWritten, TrainingStopped

pytestmark = pytest.mark.slow
BATCH, SEED, INTERVAL = 16, 7, 20


def progress(cluster: LocalCluster, job: str, generation: int) -> list[Any]:
    """Every rank's progress records of ``generation``."""
    return [record for records in cluster.progress(job, generation).values() for record in records]


def submit(cluster: LocalCluster, checkpoints: Path, profile: Path | None = None) -> str:
    """A float64 job that runs until cancelled, checkpointing every INTERVAL steps into ``checkpoints``."""
    sets: dict[str, object] = {"steps": 1_000_000, "global_batch": BATCH, "seed": SEED, "dtype": "float64"}
    sets.update(checkpoint_interval=INTERVAL, checkpoint_dir=checkpoints)
    if profile is not None:
        sets["profile"] = profile
    return cluster.submit(TINY_GPT_SPEC, **sets)


def held_step(cluster: LocalCluster, job: str, generation: int) -> int:
    """The step ``generation`` was told to take from the previous one's memory (its GenerationIssued)."""
    return issued(cluster, job, generation).held_step


def assert_loaded_from_memory(
    cluster: LocalCluster, job: str, generation: int, held: int, width: int, held_by: int | None = None
) -> None:
    """Every one of the ``width`` ranks of ``generation`` loaded step ``held`` from the memory of generation
    ``held_by`` (the previous one unless said)."""
    loaded = [r.event for r in progress(cluster, job, generation) if isinstance(r.event, CheckpointLoaded)]
    memory = f"memory of generation {generation - 1 if held_by is None else held_by}"
    assert len(loaded) == width, loaded
    assert all(e.step == held and e.checkpoint == memory for e in loaded), loaded


def assert_equals_the_reference(cluster: LocalCluster, job: str, checkpoints: Path, tmp_path: Path) -> None:
    """The newest committed checkpoint equals an uninterrupted single-process run to its step (<= 1e-9), once the
    job's trainers are gone (a write in flight at the cancel may still be committed until then)."""
    cluster.wait_released(job)
    verified = json.loads(cluster.cli("checkpoint", "verify", str(checkpoints), "--json").stdout)
    expected = train_reference(tmp_path / "reference", int(verified["step"]), BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9, f"at step {verified['step']}"


# make soak; make test: the eviction through memory below, a growth in tests/agent/test_memory_chain.py
@pytest.mark.soak
def test_growth_moves_the_layers_in_memory_and_equals_the_reference(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.up(nodes=1)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints)
    before = cluster.wait_step(job, 10, 120)
    cluster.cli("local", "add", "1")
    width = world_size(before)

    def grown(status: dict[str, Any]) -> bool:
        return status["state"] == "RUNNING" and world_size(status) > width

    after = cluster.wait_status(job, grown, 180, "growth onto the new node")
    generation = int(after["generation"])
    held = held_step(cluster, job, generation)
    assert held > 0, cluster.events(job)
    stopped = [r.event for r in progress(cluster, job, generation - 1) if isinstance(r.event, TrainingStopped)]
    assert stopped and all(s.step == held for s in stopped)
    assert all(s.checkpoint_seconds < 1.0 for s in stopped), "the stop wrote nothing on the critical path"
    cluster.wait_step(job, held + INTERVAL + 2, 180)
    assert_loaded_from_memory(cluster, job, generation, held, world_size(after))
    assert after["steps_lost"] == 0
    cluster.cli("cancel", job)
    cluster.wait_state(job, {"CANCELLED"}, 60)
    committed = {(e.fact.generation, e.fact.step) for e in cluster.facts(CheckpointCommitted, job)}
    assert any(g == generation and s >= held for g, s in committed), committed
    assert_equals_the_reference(cluster, job, checkpoints, tmp_path)


def test_an_evicted_stage_is_handed_to_a_survivor_and_the_morph_reads_no_disk(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.up(nodes=3, slots=1)  # the pipeline profile runs 3 x 1: each VM holds a stage no other holds
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints, profile=pipeline_profile(tmp_path / "pipeline_profile.json"))
    before = cluster.wait_step(job, 10, 120)
    stages = int(before["layout"]["pipeline_stages"])
    assert stages == world_size(before) >= 2, before["layout"]
    victim = stage_nodes(before, 1)[0]  # the only holder of stage 1's layers
    cluster.notes.append(f"preempted {victim}, the only VM of stage 1 of {stages}")
    cluster.cli("local", "preempt", victim, "--notice", "20")

    def moved(status: dict[str, Any]) -> bool:
        return status["state"] == "RUNNING" and int(status["generation"]) > int(before["generation"])

    after = cluster.wait_status(job, moved, 180, "the morph off the evicted VM")
    generation = int(after["generation"])
    assert victim not in cluster.job_nodes(job)
    held = held_step(cluster, job, generation)
    old = progress(cluster, job, generation - 1)
    stopped = [r.event for r in old if isinstance(r.event, TrainingStopped)]
    assert len(stopped) == stages and all(s.step == held for s in stopped), stopped
    written = [r.event for r in old if isinstance(r.event, CheckpointWritten) and r.event.step == held]
    assert not written, f"the stop wrote step {held} although the leaving rank could hand its stage over"
    cluster.wait_step(job, held + INTERVAL + 2, 180)
    assert_loaded_from_memory(cluster, job, generation, held, world_size(after))
    assert cluster.status(job)["steps_lost"] == 0
    cluster.cli("cancel", job)
    cluster.wait_state(job, {"CANCELLED"}, 60)
    assert_equals_the_reference(cluster, job, checkpoints, tmp_path)


def next_rendezvous(cluster: LocalCluster, job: str, status: dict[str, Any]) -> tuple[str, int]:
    """Where the job's next generation will meet: the controller's own draw (its secret's salt, the cluster's port
    base), which no one without the secret can tell; the host is this generation's (every local VM's)."""
    settings = json.loads(cluster.files.controller_settings.read_text())
    salt = Tokens({}, token_secret(cluster.files.state)).rendezvous_salt()
    config = Config(rendezvous_port_base=int(settings["rendezvous_port_base"]), rendezvous_salt=salt)
    endpoint = str(status["rendezvous_endpoint"])
    port = rendezvous_port(config, job, int(status["generation"]) + 1, endpoint)
    return endpoint.rsplit(":", 1)[0], port


# make soak; make test: tests/agent/test_memory_chain.py (the processes) and tests/controller/test_held_again.py
@pytest.mark.soak
def test_a_morph_that_fails_to_start_takes_the_held_step_on_its_retry(cluster: LocalCluster, tmp_path: Path) -> None:
    """A growth through memory whose next generation cannot meet (another process holds its rendezvous port): that
    generation ends, its processes hold the step again, and the one after takes it from them: no step lost."""
    cluster.up(nodes=1)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints)
    before = cluster.wait_step(job, 10, 120)
    first = int(before["generation"])
    host, port = next_rendezvous(cluster, job, before)
    with socket.socket() as squatter:
        squatter.bind((host, port))  # bound, never listening: the next rank 0 cannot bind, the others find no store
        cluster.notes.append(f"holds {host}:{port}, generation {first + 1}'s rendezvous")
        cluster.cli("local", "add", "1")

        def retried(status: dict[str, Any]) -> bool:
            return status["state"] == "RUNNING" and int(status["generation"]) >= first + 2

        after = cluster.wait_status(job, retried, 240, "the growth, failed to start, then retried")
    held = held_step(cluster, job, first + 1)
    assert held > 0 and issued(cluster, job, first + 1).held_generation == first, cluster.events(job)
    retry = issued(cluster, job, first + 2)
    assert (retry.held_step, retry.held_generation) == (held, first), retry
    assert retry.morph_cause == "start_failed", retry
    cluster.wait_step(job, held + INTERVAL + 2, 180)
    assert_loaded_from_memory(cluster, job, first + 2, held, world_size(after), held_by=first)
    assert cluster.status(job)["steps_lost"] == 0
    cluster.cli("cancel", job)
    cluster.wait_state(job, {"CANCELLED"}, 60)
    assert_equals_the_reference(cluster, job, checkpoints, tmp_path)
