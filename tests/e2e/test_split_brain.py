"""Split brain and flapping with real processes: a node cut off from the controller whose trainers keep going.

Each test runs twice, once per way of cutting the node off (the ``cut`` fixture; where namespaces can be
made, the frozen-agent variant runs in ``make soak`` only):

- ``frozen-agent`` (any host): SIGSTOP on its agent cuts the node off from the controller exactly as a
  partition would (no heartbeat leaves it) while its trainers, in process groups of their own, keep
  training and writing to the shared checkpoint directory;
- ``netns`` (root; skipped with the reason elsewhere): every VM is a network namespace and the node is
  partitioned for real, ``spotmorph local partition NODE --from controller``: its agent runs on and keeps
  trying, its peers and the checkpoint share stay reachable; ``spotmorph local heal NODE`` ends it.

The agents hold a long lease (``SPOTMORPH_LEASE_SECONDS``), so the trainers do not stop by themselves: only
the fence and the next incarnation's clean-up stand between them and the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.eventlog.facts import GenerationIssued, NodeQuarantined
from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from worker_agent.contract import CheckpointLoaded, ProgressRecord, TrainerFailed, TrainerStarted
from worker_agent.runtime.storage import checkpoint as ck

from .netns_helpers import REASON as NETNS_REASON
from .netns_helpers import assert_nothing_left, needs_netns

pytestmark = pytest.mark.slow

BATCH, SEED, INTERVAL = 16, 11, 10
# A trainer lease far beyond the test, and a node back from LOST quarantined 2 s instead of the default 10 (the
# quarantine is asserted to happen, not how long: tests/controller/test_flapping.py tests its length on a fake clock).
LONG_LEASE = {"SPOTMORPH_LEASE_SECONDS": "600", "SPOTMORPH_CONTROLLER_REJOIN_QUARANTINE_SECONDS": "2"}


# Where namespaces can be made the real partition runs in `make test` and the frozen agent in `make soak`;
# elsewhere the frozen agent is the one that runs.
FROZEN_MARKS = pytest.mark.soak if NETNS_REASON is None else ()


@pytest.fixture(params=[pytest.param("frozen-agent", marks=FROZEN_MARKS), pytest.param("netns", marks=needs_netns)])
def cut(request: pytest.FixtureRequest) -> str:
    """How a node is cut off from the controller: its agent frozen, or a real partition of its namespace."""
    return str(request.param)


@pytest.fixture
def cluster(tmp_path: Path, cut: str) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "home", env=LONG_LEASE)
    local.notes.append(f"node cut off from the controller by: {cut}")
    try:
        yield local
    finally:
        for vm in local.vms():
            signal_all([vm.pid or 0, *vm.session_pids()], signal.SIGCONT)
        local.down()
        if cut == "netns":
            assert_nothing_left(local.files.root)


def signal_all(pids: Any, sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if pid > 0:
                os.kill(pid, sig)


def up(cluster: LocalCluster, cut: str, nodes: int) -> None:
    cluster.up(nodes=nodes, heartbeat_expiry=4, netns=cut == "netns")


def partition_from_controller(cluster: LocalCluster, cut: str, node: str) -> None:
    """Cut ``node`` off from the controller (not from its peers or the share); its trainers keep running."""
    if cut == "netns":
        cluster.cli("local", "partition", node, "--from", "controller")
    else:
        signal_all([cluster.vm_of(node).pid or 0], signal.SIGSTOP)


def heal(cluster: LocalCluster, cut: str, node: str) -> None:
    if cut == "netns":
        cluster.cli("local", "heal", node)
    else:
        signal_all([cluster.vm_of(node).pid or 0], signal.SIGCONT)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def records(cluster: LocalCluster, job: str, generation: int) -> list[ProgressRecord]:
    return [r for found in cluster.progress(job, generation).values() for r in found]


def trainer_pids(found: list[ProgressRecord]) -> set[int]:
    return {r.pid for r in found if isinstance(r.event, TrainerStarted)}


def failures(found: list[ProgressRecord]) -> list[TrainerFailed]:
    return [r.event for r in found if isinstance(r.event, TrainerFailed)]


def loaded(found: list[ProgressRecord]) -> set[str]:
    return {Path(r.event.checkpoint).name for r in found if isinstance(r.event, CheckpointLoaded)}


def valid_steps(root: Path, generation: int) -> list[int]:
    return sorted(s for s, g, p in ck.checkpoint_dirs(root) if g == generation and (p / ck.MANIFEST).exists())


def issued(cluster: LocalCluster, job: str) -> dict[int, GenerationIssued]:
    """What each generation's ``GenerationIssued`` event says, by generation."""
    return {e.fact.generation: e.fact for e in cluster.facts(GenerationIssued, job)}


# make soak; make test keeps the fence through test_a_new_incarnation_never_overlaps_... and
# tests/runtime/test_fence.py
@pytest.mark.soak
def test_a_partitioned_generation_that_keeps_writing_never_makes_its_checkpoints_loadable(
    cluster: LocalCluster, cut: str, tmp_path: Path, references: Path
) -> None:
    steps = 300
    up(cluster, cut, nodes=1)
    root = tmp_path / "ckpt"
    sets: dict[str, Any] = {
        "steps": steps,
        "global_batch": BATCH,
        "seed": SEED,
        "dtype": "float64",
        "checkpoint_dir": root,
    }
    job = cluster.submit(**sets, checkpoint_interval=INTERVAL)
    cluster.wait_step(job, 40, 180)
    (alone,) = cluster.job_nodes(job)  # it runs the whole of generation 1
    partition_from_controller(cluster, cut, alone)
    # A report already on its way when the cut was made may still land: what the controller committed is
    # only final once it has stopped hearing from the node.
    cluster.wait(lambda: cluster.node_state(alone) == "LOST", 60, "the controller to lose the cut-off node")
    committed = int(cluster.status(job)["last_checkpoint_step"])
    stale = trainer_pids(records(cluster, job, 1))
    # Generation 1 keeps training and writing: checkpoints the controller never hears of.
    cluster.wait(lambda: max(valid_steps(root, 1), default=0) > committed + INTERVAL, 120, "generation 1 to write on")
    # It stalls (a slow VM) until generation 2 has started, its fence raised (before its rendezvous), then goes on:
    # stopped here, on a fast machine it cannot finish its steps before the fence is there to stop it.
    signal_all(stale, signal.SIGSTOP)
    written_unheard = max(valid_steps(root, 1))
    cluster.add(1)  # somewhere for generation 2 to run
    generation, _ = cluster.wait_new_generation(job, 1, 180)
    cluster.wait(lambda: bool(trainer_pids(records(cluster, job, generation))), 120, "generation 2's trainers to start")
    signal_all(stale, signal.SIGCONT)
    cluster.wait(lambda: bool(failures(records(cluster, job, 1))), 120, "generation 1 to run into the fence")
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 400)
    assert final["state"] == "SUCCEEDED", final

    kinds = {f.kind for f in failures(records(cluster, job, 1))}
    assert "fenced" in kinds and kinds <= {"fenced", "abort"}, kinds  # abort: a peer fenced alone mid-write
    generations = issued(cluster, job)
    resume = generations[generation]
    assert resume.resume_generation == 1 and resume.resume_step >= committed
    assert written_unheard > resume.resume_step, "generation 1 wrote a valid checkpoint past the committed one"
    for g in range(generation, int(final["generation"]) + 1):
        fact = generations[g]
        expected = {ck.step_dir(root, fact.resume_step, fact.resume_generation).name} if fact.resume_step else set()
        assert loaded(records(cluster, job, g)) == expected, f"generation {g} loaded exactly what was committed"
    # Nothing generation 1 wrote past the committed checkpoint is loadable now (fenced, or pruned as stale).
    assert all(s <= resume.resume_step for s in valid_steps(root, 1)), valid_steps(root, 1)
    expected_params = train_reference(references, steps, BATCH, SEED)
    assert max_rel_diff(expected_params, root) <= 1e-9
    assert cluster.node_state(alone) in {"LOST", "GONE"}
    heal(cluster, cut, alone)  # the link heals: the LOST incarnation is told to register again
    cluster.wait(lambda: {n["name"]: n for n in cluster.nodes()}[alone]["incarnation"] >= 2, 60, f"{alone} back")
    assert not any(alive(pid) for pid in stale), "generation 1's trainers are gone (fenced, or killed on the way back)"
    quarantined = [e for e in cluster.facts(NodeQuarantined) if e.node == alone]
    assert quarantined, f"{alone}, back soon after it was LOST, is quarantined in JOINING (flap damping)"


class DeathWatch:
    """When each of some processes was first seen dead (gone, or a zombie), polled every few milliseconds."""

    def __init__(self, pids: set[int]) -> None:
        self.dead_at: dict[int, float] = {}
        self._pids = pids
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set() and len(self.dead_at) < len(self._pids):
            for pid in self._pids - set(self.dead_at):
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
                except (OSError, IndexError):
                    state = "gone"
                if state in ("gone", "Z", "X"):
                    self.dead_at[pid] = time.time()
            time.sleep(0.005)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_a_new_incarnation_never_overlaps_its_predecessors_trainers(
    cluster: LocalCluster, cut: str, tmp_path: Path
) -> None:
    up(cluster, cut, nodes=1)
    sets: dict[str, Any] = {
        "steps": 100_000,
        "global_batch": BATCH,
        "seed": SEED,
        "dtype": "float64",
        "checkpoint_dir": tmp_path / "c",
    }
    job = cluster.submit(**sets, checkpoint_interval=INTERVAL)
    cluster.wait_step(job, 20, 180)
    (node,) = cluster.job_nodes(job)
    old = trainer_pids(records(cluster, job, 1))
    assert len(old) == 2
    partition_from_controller(cluster, cut, node)
    cluster.wait(lambda: cluster.node_state(node) == "LOST", 60, f"{node} to be LOST")
    assert all(Path(f"/proc/{pid}").exists() for pid in old), "the long lease keeps its trainers going"
    watch = DeathWatch(old)
    heal(cluster, cut, node)  # the link heals: the LOST incarnation kills its trainers and registers anew
    generation, world = cluster.wait_new_generation(job, 1, 240)
    watch.stop()
    new = records(cluster, job, generation)
    started = [r.event.process_started_at for r in new if isinstance(r.event, TrainerStarted)]
    assert len(started) == world and all(t is not None for t in started)
    assert set(watch.dead_at) == old, "the old trainers are gone"
    assert max(watch.dead_at.values()) <= min(t for t in started if t is not None), (
        f"a trainer of the new incarnation started before its predecessor's died: {watch.dead_at} vs {started}"
    )
    nodes = {n["name"]: n for n in cluster.nodes()}
    assert nodes[node]["incarnation"] >= 2
    quarantined = [e for e in cluster.facts(NodeQuarantined) if e.node == node]
    assert quarantined, "the node back soon after LOST was quarantined in JOINING"
    cluster.cli("cancel", job)
