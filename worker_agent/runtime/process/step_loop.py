"""The step loop of one generation: at every step boundary the ranks agree on what happens next, then act.

Each rank says what it knows (:class:`~worker_agent.runtime.process.boundary.Said`: a stop asked of its node, its share
of the last step's loss, a checkpoint asked for, its lease lapsed, the fence raised past it, whether it may keep
its stage in memory, whether its node leaves), one all-reduce sums it (``Agreed``), the pure
:func:`~worker_agent.runtime.process.boundary.decide` makes it a ``Boundary`` (the same branch on every rank), and
:func:`execute` carries it out: exit fenced or lapsed, report the step, evaluate, hand off, checkpoint, keep the
stage, stop or finish, or train the next step. A collective that fails is a lost peer: the rank holds its last
completed step for a salvage.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from worker_agent.contract import (
    CheckpointWritten,
    EvaluationCompleted,
    ExitCode,
    FailureKind,
    HandOffFailed,
    StepCompleted,
    TrainerFailed,
    TrainingFinished,
    TrainingStopped,
)
from worker_agent.runtime.morph import held as held_mod
from worker_agent.runtime.morph import snapshots
from worker_agent.runtime.morph.handoff import hand_off
from worker_agent.runtime.morph.held import Held
from worker_agent.runtime.process.boundary import Agreed, Boundary, Kind, Own, Said, Shared, decide
from worker_agent.runtime.process.generation import Generation
from worker_agent.runtime.process.trainer_setup import check_eval_loss, say, warn
from worker_agent.runtime.profiling.step_profile import StepProfiler, parse_request
from worker_agent.runtime.storage.checkpoint import LayerPayload
from worker_agent.runtime.storage.host_buffers import HostLease


def agree(said: Said) -> Agreed:
    """One all-reduce of seven slots over the default group."""
    import torch
    import torch.distributed as dist

    flags = torch.tensor(said.slots(), dtype=torch.float64)
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)
    return Agreed(*(float(v) for v in flags))


def count_leaving(leaving: bool) -> float:
    """How many ranks leave, asked again once a stop is agreed (one node's ranks see the same stop file)."""
    import torch
    import torch.distributed as dist

    count = torch.tensor([float(leaving)], dtype=torch.float64)
    dist.all_reduce(count, op=dist.ReduceOp.SUM)
    return float(count[0])


@dataclass
class Pace:
    """When the step being reported began, and its loss share (what the rank says at the next boundary)."""

    started: float = field(default_factory=time.perf_counter)
    loss_share: float = 0.0


def run(g: Generation) -> ExitCode:
    """Train ``g`` to its last step or to the stop it agrees on; a failed collective holds the step for a salvage."""
    from worker_agent.runtime.morph import salvage

    g.abort.start()
    stream = snapshots.open_stream(g.layout, g.cfg.rank, g.job.snapshot_interval, None, 0.0)  # idle until opened
    try:
        plan = snapshots.applies(g.layout, g.job.snapshot_interval, g.job.morph_through_memory)
        job = g.job
        stream = snapshots.open_stream(
            g.layout, g.cfg.rank, job.snapshot_interval, plan, job.peer_timeout_seconds, job.snapshot_interval_adapts
        )
        return _boundaries(g, stream)
    except Exception as exc:
        g.abort.stop()
        if not salvage.is_collective_failure(exc):
            raise
        return _hold_for_salvage(g, g.abort.explain(exc), stream)
    finally:
        g.abort.stop()  # every way out of the loop: a fenced, lapsed, finished or crashed rank aborts nothing


def _copy_stage(g: Generation, lease: HostLease) -> tuple[dict[int, LayerPayload], dict[str, Any] | None]:
    """Exact host copies of this rank's stage (a peer snapshot's own copy) into ``lease``'s buffers, by layer, and
    the loss scale."""
    runner = g.runner
    layers = list(range(runner.first, runner.last))
    copies = runner.payloads(layers, lease)
    scale = runner.loss_scale.to_dict() if runner.scaling else None
    return {i: copies[runner.model.layer_names[i]] for i in layers}, scale


def _boundaries(g: Generation, stream: snapshots.SnapshotStream) -> ExitCode:
    """Each boundary: say, agree, decide, carry the decision out (and the peer snapshots: commit, begin); then the
    next step, unless it ended."""
    pace = Pace()
    profiler = StepProfiler(parse_request(os.environ), g.cfg.rank, g.device.type == "cuda")
    while True:
        profiler.before(g.step)
        fenced = g.writer.fenced_off()
        said = Said(
            g.stop.requested(),
            pace.loss_share,
            g.requests.contribution(),
            g.lease.lapsed(),
            bool(fenced),
            not g.can_hold,
            g.stop.leaving(),
            *stream.said(),
        )
        agreed = agree(said)
        shared, own = _facts(g, agreed, said.leaving)
        code = execute(g, decide(agreed, shared, own), agreed, own, pace, fenced)
        if code is not None:
            stream.settle(g.job.peer_timeout_seconds)  # a stream in flight ends before the groups are let go
            return code
        copy = functools.partial(_copy_stage, g)
        if (interval := stream.at_boundary(g.step, agreed.snapshot_running, agreed.snapshot_failed, copy)) is not None:
            cost, step = stream.costs.figures()
            say(f"peer snapshots every {interval} step(s): one costs {cost:.3f} s here, a step {step:.3f} s")
        pace.started = time.perf_counter()
        pace.loss_share = g.runner.run_step(g.step)
        stream.stepped(time.perf_counter() - pace.started)
        profiler.after(g.step)
        g.step += 1


def _facts(g: Generation, agreed: Agreed, leaving: bool) -> tuple[Shared, Own]:
    """What :func:`decide` needs besides ``agreed``; once a stop is agreed, each rank reads whether it leaves
    again and the ranks count the leavers again (one node's ranks see the same stop file)."""
    leavers = agreed.leaving
    if agreed.stopping and not agreed.ends_at_once:
        leaving = g.stop.leaving()
        leavers = count_leaving(leaving)
    job = g.job
    shared = Shared(
        step=g.step,
        first_step=g.first_step,
        steps=job.steps,
        eval_interval=job.eval_interval,
        checkpoint_interval=job.checkpoint_interval,
        world_size=g.layout.world_size,
        leavers=leavers,
        requested=g.requests.requested(agreed.checkpoint_request),
        already_written=g.already_written,
        durable_due=g.durable_due,
    )
    return shared, Own(can_hold=g.can_hold, leaving=leaving)


def execute(
    g: Generation, boundary: Boundary, agreed: Agreed, own: Own, pace: Pace, fenced: str | None
) -> ExitCode | None:
    """Carry ``boundary`` out; the generation's exit code when it ends here, None to train the next step."""
    if boundary.kind is Kind.FENCED:
        # A newer generation raised the fence: the controller moved past this one. All ranks stop here.
        why = fenced or "another rank found the checkpoint directory's fence raised past this generation"
        return _fail(g, "fenced", why, ExitCode.FENCED)
    if boundary.kind is Kind.LEASE_LAPSED:
        # Some rank's agent stopped renewing its lease: the controller has lost (or will lose) that node, so
        # this generation is over. Every rank stops at this same boundary, without a checkpoint.
        return _fail(g, "lease_expired", g.lease.explain(g.step), ExitCode.LEASE_EXPIRED)
    stop_at, now = time.time(), time.perf_counter()
    if boundary.report:
        seconds = now - pace.started
        g.progress.emit(
            StepCompleted(
                step=g.step,
                loss=agreed.loss,
                step_seconds=seconds,
                samples_per_second=g.job.global_batch / seconds,
                last_checkpoint=g.writer.last_committed,
            )
        )
    if boundary.evaluate:
        _evaluate(g)
    write_started = time.perf_counter()
    kept, handed_off = _hand_off(g, own) if boundary.hand_off else (None, False)
    if boundary.writes(handed_off):
        _write(g, boundary, write_started)
    if boundary.hold:
        g.writer.wait()
        g.keep(kept or _keep_stage(g))
    if not boundary.finishing:
        return None
    ended = TrainingStopped if boundary.kind is Kind.STOP else TrainingFinished
    seconds = time.perf_counter() - write_started
    g.progress.emit(
        ended(step=g.step, last_checkpoint=g.writer.last_committed, stop_at=stop_at, checkpoint_seconds=seconds)
    )
    return ExitCode.SUCCEEDED


def _fail(g: Generation, kind: FailureKind, message: str, code: ExitCode) -> ExitCode:
    warn(message)
    g.progress.emit(TrainerFailed(kind=kind, message=message))
    return code


def _evaluate(g: Generation) -> None:
    started = time.perf_counter()
    eval_loss = g.runner.evaluate(g.step)
    seconds = time.perf_counter() - started
    check_eval_loss(eval_loss, g.step)
    g.progress.emit(EvaluationCompleted(step=g.step, eval_loss=eval_loss, eval_seconds=seconds))
    g.timeouts.settle()


def _keep_stage(g: Generation) -> Held:
    return held_mod.keep_stage(g.runner, g.job.identity_hash(), g.cfg.generation, g.step, g.cfg.rank)


def _hand_off(g: Generation, own: Own) -> tuple[Held, bool]:
    """A stop through memory where some node leaves: every rank keeps its stage and the leaving ones hand what
    only they hold to staying ones (:mod:`worker_agent.runtime.morph.handoff`); whether that succeeded."""
    kept = _keep_stage(g)
    handed = hand_off(kept, own.leaving, g.layout, g.cfg.rank, g.job.peer_timeout_seconds)
    say(f"handed off at step {g.step}: sent {handed.sent} B, received {handed.received} B")
    if not handed.ok:
        warn(f"the hand-off failed ({handed.reason}); the stop writes step {g.step}")
        g.progress.emit(HandOffFailed(step=g.step, reason=handed.reason))
    return kept, handed.ok


def _write(g: Generation, boundary: Boundary, started: float) -> None:
    """Write the step's checkpoint (in the background where the job or the boundary says) and say how long
    training paused: the copy to host memory, plus the write itself unless in the background."""
    runner, writer, step = g.runner, g.writer, g.step
    writer.wait()  # the previous write is done before new host copies are taken (its buffers reused)
    buffers = runner.host.lease()
    live = boundary.background and g.device.type == "cpu"  # no copy: the next update waits for the read
    writer.save(
        step,
        runner.payloads(lease=buffers, share=live),
        g.manifest() if g.cfg.rank == 0 else None,
        done=buffers.release,
        background=True if boundary.background else None,
    )
    runner.before_update = writer.files_written if live else None
    if boundary.finishing:
        writer.wait()
    stall = time.perf_counter() - started
    g.progress.emit(CheckpointWritten(step=step, last_checkpoint=writer.last_committed, stall_seconds=stall))
    if not boundary.finishing:
        g.timeouts.settle()  # slower writers catch up before the next step's collectives


def _hold_for_salvage(g: Generation, why: str, stream: snapshots.SnapshotStream) -> ExitCode:
    """A collective failed (a peer is gone): hold the last completed step for the controller's salvage order."""
    from worker_agent.runtime.morph import salvage

    cfg, job, runner, step = g.cfg, g.job, g.runner, g.step
    warn(f"collective failed after step {step} ({why}); holding step {step} for a just-in-time checkpoint")
    g.writer.files_written()  # a write still reading the live tensors (after a morph) reads them before anyone else
    keeps = g.can_hold and not g.stop.leaving() and step < job.steps
    salvage.sever(g.communicators)  # a snapshot streaming to or from the lost peer fails now, not at its timeout
    stream.settle()
    own, received = stream.holding()
    if keeps:  # for the next generation, should the controller keep the step in memory (stop) not write it
        g.keep(snapshots.attach(_keep_stage(g), stream, job.identity_hash(), cfg.generation))
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
        communicators=g.communicators,
        snapshots=(own, received) if keeps else ((), ()),
    )
