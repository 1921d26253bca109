"""The step loop of one generation: at every step boundary the ranks agree on what happens next, then act.

Each rank says what it knows (:class:`Said`: a stop asked of its node, its share of the last step's loss, a
checkpoint asked for, its lease lapsed, the fence raised past it, whether it may keep its stage in memory,
whether its node leaves), one all-reduce sums it (:class:`Agreed`), and every rank takes the same branch:
fenced or lapsed (exit without a checkpoint), report the step, evaluate, checkpoint, stop or finish (keep
the stage for the next generation, hand what only a leaving rank holds to a staying one), or train the next
step. A collective that fails is a lost peer: the rank holds its last completed step for a salvage.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from worker_agent.contract import (
    CheckpointWritten,
    EvaluationCompleted,
    ExitCode,
    HandOffFailed,
    StepCompleted,
    TrainerFailed,
    TrainingFinished,
    TrainingStopped,
)
from worker_agent.runtime import held as held_mod
from worker_agent.runtime.generation import Generation
from worker_agent.runtime.handoff import hand_off
from worker_agent.runtime.held import Held
from worker_agent.runtime.step_profile import StepProfiler, parse_request
from worker_agent.runtime.trainer_setup import check_eval_loss, say, warn


@dataclass(frozen=True)
class Said:
    """What one rank says at a step boundary."""

    stop: bool  # its node was asked to stop (a planned morph)
    loss_share: float  # its part of the last step's loss (the global batch's, summed over the ranks)
    checkpoint_request: float  # rank 0: the newest checkpoint request it saw (0: none)
    lease_lapsed: bool  # its agent stopped renewing its lease
    fenced: bool  # the checkpoint directory's fence is past this generation
    cannot_hold: bool  # it may not keep its stage in memory (the job morphs through the disk)
    leaving: bool  # its node leaves with this stop (an eviction notice)


@dataclass(frozen=True)
class Agreed:
    """The world's sums of what every rank said: the same on every rank, so every rank takes the same branch."""

    stops: float
    loss: float
    checkpoint_request: float
    lapsed: float
    fenced: float
    cannot_hold: float
    leaving: float

    @property
    def stopping(self) -> bool:
        return self.stops > 0


def agree(said: Said) -> Agreed:
    """One all-reduce of seven slots over the default group."""
    import torch
    import torch.distributed as dist

    slots = (said.stop, said.loss_share, said.checkpoint_request, said.lease_lapsed, said.fenced, said.cannot_hold)
    flags = torch.tensor([*map(float, slots), float(said.leaving)], dtype=torch.float64)
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)
    return Agreed(*(float(v) for v in flags))


def count_leaving(leaving: bool) -> float:
    """How many ranks leave, asked again once a stop is agreed (one node's ranks see the same stop file)."""
    import torch
    import torch.distributed as dist

    count = torch.tensor([float(leaving)], dtype=torch.float64)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return float(count[0])


def run(g: Generation, keep: Callable[[Held], None]) -> ExitCode:
    """Train ``g`` to its last step or to the stop it agrees on; ``keep`` takes the stage it keeps in memory."""
    from worker_agent.runtime import salvage

    cfg, job, runner, writer, progress = g.cfg, g.job, g.runner, g.writer, g.progress
    g.abort.start()
    last_time = time.perf_counter()
    loss_share = 0.0
    profiler = StepProfiler(parse_request(os.environ), cfg.rank, g.device.type == "cuda")
    try:
        while True:
            profiler.before(g.step)
            stop, lapsed, fenced, leaving = g.stop.requested(), g.lease.lapsed(), writer.fenced_off(), g.stop.leaving()
            said = Said(stop, loss_share, g.requests.contribution(), lapsed, bool(fenced), not g.can_hold, leaving)
            agreed = agree(said)
            if agreed.fenced > 0:
                # A newer generation raised the fence: the controller moved past this one. All ranks stop here.
                message = fenced or "another rank found the checkpoint directory's fence raised past this generation"
                warn(message)
                progress.emit(TrainerFailed(kind="fenced", message=message))
                return ExitCode.FENCED
            if agreed.lapsed > 0:
                # Some rank's agent stopped renewing its lease: the controller has lost (or will lose) that node, so
                # this generation is over. Every rank stops at this same boundary, without a checkpoint.
                message = g.lease.explain(g.step)
                warn(message)
                progress.emit(TrainerFailed(kind="lease_expired", message=message))
                return ExitCode.LEASE_EXPIRED
            stopping = agreed.stopping
            leavers = agreed.leaving
            if stopping:  # "leaving" read again after the agreement: one node's ranks see the same stop file
                leaving = g.stop.leaving()
                leavers = count_leaving(leaving)
            requested = g.requests.requested(agreed.checkpoint_request)
            stop_at = time.time()
            now = time.perf_counter()
            step = g.step
            if step > g.first_step:
                progress.emit(
                    StepCompleted(
                        step=step,
                        loss=agreed.loss,
                        step_seconds=now - last_time,
                        samples_per_second=job.global_batch / (now - last_time),
                        last_checkpoint=writer.last_committed,
                    )
                )
            if step > g.first_step and job.eval_interval > 0 and step % job.eval_interval == 0:
                started = time.perf_counter()
                eval_loss = runner.evaluate(step)
                seconds = time.perf_counter() - started
                check_eval_loss(eval_loss, step)
                progress.emit(EvaluationCompleted(step=step, eval_loss=eval_loss, eval_seconds=seconds))
                g.timeouts.settle()
            finishing = stopping or step >= job.steps
            # A rank that may and stays keeps its stage (its tensors; copies on a GPU) for the next generation. When
            # every rank may and one stays, the stop writes nothing: leaving ranks first hand what only they hold
            # to staying ones (handoff.py), and the next generation writes the step in the background.
            holding = stopping and step < job.steps and g.can_hold and not leaving
            in_memory = stopping and step < job.steps and agreed.cannot_hold == 0 and leavers < g.layout.world_size
            write_started = time.perf_counter()
            kept = None
            if in_memory and leavers > 0:
                kept = held_mod.keep_stage(runner, job.identity_hash(), cfg.generation, step, cfg.rank)
                handed = hand_off(kept, leaving, g.layout, cfg.rank, job.peer_timeout_seconds)
                in_memory = handed.ok
                say(f"handed off at step {step}: sent {handed.sent} B, received {handed.received} B")
                if not handed.ok:
                    warn(f"the hand-off failed ({handed.reason}); the stop writes step {step}")
                    progress.emit(HandOffFailed(step=step, reason=handed.reason))
            interval = job.checkpoint_interval > 0 and step % job.checkpoint_interval == 0
            due = requested or step == g.durable_due or (not in_memory and (finishing or interval))
            if due and step != g.already_written:
                writer.wait()  # the previous write is done before new host copies are taken (its buffers reused)
                buffers = runner.host.lease()
                live = step == g.durable_due and g.device.type == "cpu"  # no copy: the next update waits for the read
                writer.save(
                    step,
                    runner.payloads(lease=buffers, share=live),
                    g.manifest() if cfg.rank == 0 else None,
                    done=buffers.release,
                    background=True if step == g.durable_due else None,
                )
                runner.before_update = writer.files_written if live else None
                if finishing:
                    writer.wait()
                # How long training paused: the copy to host memory, plus the write itself unless in the background.
                stall = time.perf_counter() - write_started
                progress.emit(CheckpointWritten(step=step, last_checkpoint=writer.last_committed, stall_seconds=stall))
                if not finishing:
                    g.timeouts.settle()  # slower writers catch up before the next step's collectives
            if holding:
                writer.wait()
                keep(kept or held_mod.keep_stage(runner, job.identity_hash(), cfg.generation, step, cfg.rank))
            if finishing:
                ended = TrainingStopped if stopping else TrainingFinished
                progress.emit(
                    ended(
                        step=step,
                        last_checkpoint=writer.last_committed,
                        stop_at=stop_at,
                        checkpoint_seconds=time.perf_counter() - write_started,
                    )
                )
                return ExitCode.SUCCEEDED
            last_time = time.perf_counter()
            loss_share = runner.run_step(step)
            profiler.after(step)
            g.step = step + 1
    except Exception as exc:
        g.abort.stop()
        if not salvage.is_collective_failure(exc):
            raise
        return _hold_for_salvage(g, keep, g.abort.explain(exc))
    finally:
        g.abort.stop()  # every way out of the loop: a fenced, lapsed, finished or crashed rank aborts nothing


def _hold_for_salvage(g: Generation, keep: Callable[[Held], None], why: str) -> ExitCode:
    """A collective failed (a peer is gone): hold the last completed step for the controller's salvage order."""
    from worker_agent.runtime import salvage

    cfg, job, runner, step = g.cfg, g.job, g.runner, g.step
    warn(f"collective failed after step {step} ({why}); holding step {step} for a just-in-time checkpoint")
    g.writer.files_written()  # a write still reading the live tensors (after a morph) reads them before anyone else
    keeps = g.can_hold and not g.stop.leaving() and step < job.steps
    if keeps:  # for the next generation, should the controller keep the step in memory (stop) not write it
        keep(held_mod.keep_stage(runner, job.identity_hash(), cfg.generation, step, cfg.rank))
    return salvage.hold(
        kept=keeps,
        rank=cfg.rank,
        generation=cfg.generation,
        stage=runner.stage,
        replica=runner.replica,
        step=step,
        error=why,
        progress=g.progress,
        control=g.control,
        root=cfg.checkpoint_dir,
        hold_seconds=max(60.0, 3 * job.timeout_seconds),
        # The pool's free buffers, fresh ones only for what a write in flight still holds.
        payloads=lambda: runner.payloads(list(range(runner.first, runner.last)), runner.host.lease()),
        manifest=g.manifest,
        fence=g.writer.fence,
    )
