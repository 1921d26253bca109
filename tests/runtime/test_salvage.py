"""A peer killed mid-training: the survivors hold their last completed step and write it on order.

Real trainer processes of a 2 x 2 layout (float64), started as an agent starts them, with a salvage
order written into their control dir as an agent writes the controller's. Killing one rank makes the
three others report ``CollectiveFailed`` within seconds, at the same step; the two writers the order
names (one per stage) write that step from memory, the first commits the manifest, and the checkpoint
equals an uninterrupted 1 x 1 run of as many steps (<= 1e-9). A writer killed during the write leaves
no manifest: no checkpoint, nothing a reader would load. A peer that is frozen rather than dead keeps its
connections open; when the agent asks (the controller holds the generation), the others abort theirs and
hold at once instead of waiting out the peer timeout.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from morphing.jobspec import JobSpec
from morphing.layout import Layout, make_layout
from tests.runtime.helpers import TINY, train, wait_for
from tests.zygotes import NodeZygote
from worker_agent.agent.holders import Process, kill_group
from worker_agent.agent.zygote import InheritedProcess, Zygote
from worker_agent.contract import (
    CollectiveFailed,
    ExitCode,
    GenerationDir,
    SalvageOrder,
    SalvageWritten,
    StepCompleted,
    TrainerArguments,
    WarmAssignment,
    WarmSpool,
    read_progress,
)
from worker_agent.runtime.morph.salvage import PAUSE_ENV
from worker_agent.runtime.storage import checkpoint as ck

pytestmark = pytest.mark.slow

BATCH, SEED, LAYERS = 7, 0, 4


def layout() -> Layout:
    return make_layout(num_layers=LAYERS, pipeline_stages=2, data_parallel=2, micro_batch_size=2, global_batch=BATCH)


class Run:
    """Four trainer processes of one generation, the first hosting the store: forked from ``zygote`` and handed
    their arguments, as a CPU node's agent starts them (without one: each a new interpreter, as a GPU node's)."""

    def __init__(
        self,
        tmp: Path,
        env: dict[str, str] | None = None,
        peer_timeout_seconds: float = 5.0,
        zygote: InheritedProcess | None = None,
    ) -> None:
        from spotmorph.local.processes import port_range_base

        self.root = tmp / "ckpt"
        self.dir = GenerationDir(tmp / "job" / "gen-1")
        self.dir.control.path.mkdir(parents=True)
        job = JobSpec(
            name="salvage",
            entrypoint=TINY,
            global_batch=BATCH,
            steps=10**6,
            seed=SEED,
            dtype="float64",
            checkpoint_interval=1000,
            checkpoint_dir=str(self.root),
            peer_timeout_seconds=peer_timeout_seconds,
            device="cpu",
        )
        self.dir.job_file.write_text(job.model_dump_json())
        self.layout = layout()
        self.dir.layout_file.write_text(json.dumps(self.layout.to_dict()))
        port = port_range_base(1)  # below the ephemeral range: no outgoing connection takes it
        self.dir.write_rendezvous_key(secrets.token_hex(32))  # what the agent writes from the assignment
        environment = {**os.environ, **(env or {})}
        self.zygote = None if zygote is None else Zygote.adopt(zygote, WarmSpool(tmp / "zygote"), environment)
        self.procs: list[Process] = []
        for rank in range(4):
            arguments = TrainerArguments.in_generation_dir(
                self.dir, rank, f"127.0.0.1:{port}", self.root, host_store=rank == 0
            )
            if self.zygote is not None:
                spool = WarmSpool(tmp / "warm" / str(rank))
                spool.path.mkdir(parents=True)
                self.procs.append(self.zygote.fork(spool))
                spool.hand_over(WarmAssignment(arguments, self.dir.log_file(rank)).to_json())
                continue
            log = open(self.dir.log_file(rank), "wb")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    arguments.command(sys.executable), stdout=log, stderr=subprocess.STDOUT, env=environment
                )
            )

    def events(self, rank: int, kind: type) -> list:  # type: ignore[type-arg]
        return [r.event for r in read_progress(self.dir.progress_file(rank)) if isinstance(r.event, kind)]

    def logs(self) -> str:
        return "\n".join(f"--- rank {r} ---\n{self.dir.log_file(r).read_text()[-1500:]}" for r in range(4))

    def kill(self, rank: int) -> None:
        os.kill(self.procs[rank].pid, signal.SIGKILL)
        self.procs[rank].wait()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                if isinstance(proc, subprocess.Popen):
                    proc.kill()
                else:
                    kill_group(proc)
                proc.wait()
        if self.zygote is not None:
            self.zygote.stop()


@pytest.fixture
def run(tmp_path: Path, node_zygote: NodeZygote) -> Iterator[Run]:
    started = Run(tmp_path, zygote=node_zygote())
    try:
        yield started
    finally:
        started.stop()


def held_after_killing(run: Run, victim: int) -> dict[int, int]:
    """Kill ``victim`` once every rank is past step 3; the step each survivor says it holds."""
    wait_for(lambda: all(len(run.events(r, StepCompleted)) >= 3 for r in range(4)), 120, "four ranks at step 3")
    run.kill(victim)
    survivors = [r for r in range(4) if r != victim]
    wait_for(lambda: all(run.events(r, CollectiveFailed) for r in survivors), 30, "survivors to report")
    return {r: run.events(r, CollectiveFailed)[0].step for r in survivors}


def test_survivors_hold_the_same_step_and_their_salvage_equals_the_reference(run: Run, tmp_path: Path) -> None:
    held = held_after_killing(run, victim=1)  # replica 0's stage 1
    # Replica 1 may finish a step whose clipping all-reduce failed for rank 0 (its pipeline peer is dead):
    # survivors hold at most two neighbouring steps, and a writer per stage holds the newest.
    assert max(held.values()) - min(held.values()) <= 1, (held, run.logs())
    step = held[3]  # stage 1's only survivor
    stage0 = next(r for r in (0, 2) if held[r] == step)
    reported = max(e.step for r in held for e in run.events(r, StepCompleted))
    assert reported <= step <= reported + 1  # at most the step in flight is lost
    for rank, failure in ((r, run.events(r, CollectiveFailed)[0]) for r in held):
        assert (failure.replica, failure.stage) == run.layout.coords(rank) and failure.generation == 1
    order = SalvageOrder(step, (stage0, 3), time.time() + 60)  # one writer per stage
    run.dir.control.request_salvage(order.to_json())
    for rank in held:
        expected = ExitCode.SUCCEEDED if held[rank] == step else ExitCode.ABORTED  # a stale holder is not named
        assert run.procs[rank].wait(60) in (ExitCode.SUCCEEDED, expected), run.logs()
    written = [e for r in (stage0, 3) for e in run.events(r, SalvageWritten)]
    assert [e.step for e in written] == [step, step], written
    assert [e.last_checkpoint for e in written if e.committed] == [step], written  # one writer commits
    assert not run.events(2 if stage0 == 0 else 0, SalvageWritten)  # not named: writes nothing
    salvaged = ck.verify(ck.step_dir(run.root, step, 1))
    assert {f.writer_rank for f in salvaged.manifest.files} == {stage0, 3}
    assert sorted(f.layer for f in salvaged.manifest.files) == sorted(salvaged.manifest.layer_names)
    reference = tmp_path / "reference"
    train(reference, 1, 1, step, f"--checkpoint-interval={step}")
    diff = ck.diff(ck.verify(ck.step_dir(reference, step)), salvaged)
    assert not diff["missing"] and diff["max_rel"] <= 1e-9, diff


# make soak; make test: the salvage itself below, and no half-written checkpoint loads (tests/runtime: damage)
@pytest.mark.soak
def test_a_writer_killed_during_the_salvage_leaves_no_checkpoint(tmp_path: Path) -> None:
    run = Run(tmp_path, {PAUSE_ENV: "4"})
    try:
        held = held_after_killing(run, victim=1)
        step = held[3]  # stage 1's only survivor (rank 1 is killed) ...
        stage0 = next((r for r in (0, 2) if held[r] == step), None)  # ... and a stage-0 rank holding that step
        assert stage0 is not None, (held, run.logs())  # (a rank may have failed a step before another)
        writers = (stage0, 3)
        run.dir.control.request_salvage(SalvageOrder(step, writers, time.time() + 8).to_json())
        layer_files = ck.step_dir(run.root, step, 1)
        wait_for(lambda: len(list(layer_files.glob("*.pt"))) >= LAYERS, 30, "the writers' layer files")
        run.kill(3)  # in its pause: layer files written, no part file yet
        assert run.procs[writers[0]].wait(60) == ExitCode.CHECKPOINT_NOT_WRITTEN, run.logs()
        assert not (layer_files / ck.MANIFEST).exists()
        with pytest.raises(ck.CheckpointError, match="no manifest"):
            ck.verify(layer_files)
        assert ck.newest_valid(run.root) is None  # a reader finds nothing to load, not half a checkpoint
    finally:
        run.stop()


def test_an_agents_abort_order_makes_ranks_blocked_on_a_frozen_peer_hold_at_once(
    tmp_path: Path, node_zygote: NodeZygote
) -> None:
    """Long before the peer timeout, only the agent's order can fail the collectives of ranks blocked on a
    frozen peer. A rank whose gloo send or receive was posted after the cut may miss it and hold only at the
    peer timeout (docs/DESIGN.md, "An unplanned loss"); every survivor holds by then."""
    peer_timeout = 45.0
    run = Run(tmp_path, peer_timeout_seconds=peer_timeout, zygote=node_zygote())
    try:
        wait_for(lambda: all(len(run.events(r, StepCompleted)) >= 3 for r in range(4)), 120, "four ranks at step 3")
        os.kill(run.procs[3].pid, signal.SIGSTOP)  # frozen: its sockets stay open, so nobody sees it go
        survivors = (0, 1, 2)
        run.dir.control.request_abort()
        # The first to read the order severs its connections, which fails the others' collectives too, so a
        # survivor failed by a severed peer may record its hold before the one that read the order records its own.
        wait_for(
            lambda: any("agent's order" in f.error for r in survivors for f in run.events(r, CollectiveFailed)),
            20,
            "a survivor to hold on the agent's order, long before the peer timeout",
        )
        wait_for(lambda: all(run.events(r, CollectiveFailed) for r in survivors), peer_timeout + 60, "every hold")
        held = [run.events(r, CollectiveFailed)[0].step for r in survivors]
        # As when a peer is killed: a replica whose last collective of a step went through for it holds that
        # step, one more than a replica whose part of it failed (the salvage picks writers that hold the newest).
        assert max(held) - min(held) <= 1, (held, run.logs())
    finally:
        os.kill(run.procs[3].pid, signal.SIGCONT)
        run.stop()
