"""The trainer process: one rank of a layout, started by ``spotmorph train`` or by a worker agent.

``python -m worker_agent.runtime.trainer`` with the arguments of
:class:`worker_agent.contract.TrainerArguments`; it reports :mod:`worker_agent.contract.events` and ends
with an :class:`worker_agent.contract.ExitCode`. The generation prefixes every rendezvous key, so a
trainer of generation g never meets one of g+1. The job's device is resolved before the rendezvous
(CUDA asked for on a node without it exits 2 at once), and a rank on a GPU uses ``cuda:<device_index>``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from morphing.errors import UserInputError
from morphing.layout import Layout
from worker_agent.contract import (
    CheckpointLoaded,
    CheckpointSkipped,
    CheckpointWritten,
    ControlDir,
    EvaluationCompleted,
    ExitCode,
    HeldStateSkipped,
    StepCompleted,
    TrainerArguments,
    TrainerFailed,
    TrainerStarted,
    TrainingFinished,
    TrainingStopped,
)
from worker_agent.contract.hostile import HostileFile, load_json_bounded
from worker_agent.runtime import held as held_mod
from worker_agent.runtime import resume
from worker_agent.runtime.control import CheckpointRequests, LeaseWatch, ProgressLog, StopRequest
from worker_agent.runtime.errors import CheckpointError, CheckpointWriteFailed, FenceError, NodeUnfit
from worker_agent.runtime.handoff import hand_off
from worker_agent.runtime.held import Held
from worker_agent.runtime.spool import take_over
from worker_agent.runtime.startup import Phase, StartupWatch
from worker_agent.runtime.trainer_setup import check_eval, check_eval_loss, process_started_at, rendezvous

# Set by a warm trainer (worker_agent.runtime.warm) when its assignment arrived: the process was started
# long before, so this is when the trainer "started".
ASSIGNED_AT: float | None = None
# What this process kept after its last generation stopped (a planned morph through memory), and what the
# generation that just stopped keeps for the next one (worker_agent.runtime.held).
HELD: Held | None = None
KEPT: Held | None = None
PARENT = os.getppid()  # the agent (or the warm trainer's agent): a holder exits when it is gone


def train(cfg: TrainerArguments, progress: ProgressLog) -> ExitCode:
    import torch
    import torch.distributed as dist

    from worker_agent.runtime import checkpoint as ckpt_mod
    from worker_agent.runtime import salvage, warm_model
    from worker_agent.runtime.comm import configure_nccl, make_groups
    from worker_agent.runtime.device import autocast_dtype, resolve_device
    from worker_agent.runtime.dropout import warm_up as warm_up_dropout
    from worker_agent.runtime.engine import StageRunner
    from worker_agent.runtime.hf_export import write_config as write_hf_config
    from worker_agent.runtime.job import MAX_INPUT_BYTES, data_cursor, load_job_spec, torch_dtype
    from worker_agent.runtime.model_api import dropout_dtypes

    job = load_job_spec(cfg.job_file)
    try:
        layout = Layout.from_dict(load_json_bounded(cfg.layout_file, MAX_INPUT_BYTES))
    except (OSError, HostileFile) as exc:
        raise UserInputError(f"cannot read layout {cfg.layout_file}: {exc}") from exc
    if layout.global_batch != job.global_batch:
        raise UserInputError(f"layout global_batch={layout.global_batch} but job has {job.global_batch}")
    if not 0 <= cfg.rank < layout.world_size:
        raise UserInputError(f"rank {cfg.rank} is outside the layout's {layout.world_size} ranks")
    device = resolve_device(job.device, cfg.device_index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        configure_nccl()
        # The node's cores are shared by its GPUs' trainers (start-up checks and batches run on the CPU).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, torch.cuda.device_count())))
        if job.exact:  # the same kernels, the same bits (cuBLAS needs its workspace fixed before its first call)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
    else:
        torch.set_num_threads(1)  # P x D ranks share this machine's cores
    model, reused = warm_model.model_for(job, layout, device)  # the model a held generation of it built
    spec = model.spec
    check_eval(spec, job.eval_interval)
    warm_up_dropout(device, dropout_dtypes(spec, torch_dtype(job.dtype), autocast_dtype(job.precision)))
    control = ControlDir(cfg.control_dir) if cfg.control_dir is not None else None
    stop = StopRequest(control)
    requests = CheckpointRequests(control, cfg.rank)
    lease = LeaseWatch(control)
    with StartupWatch(progress, cfg.rank).phase(Phase.FENCE, max(60.0, 3 * job.timeout_seconds)):
        fence = resume.fence_of(cfg)  # before the rendezvous: before this generation loads anything
    ready_at = time.time()  # torch imported, model built: what a cold start costs before the rendezvous
    rendezvous(cfg, layout.world_size, job.timeout_seconds)
    progress.emit(
        TrainerStarted(
            layout=layout.describe(),
            process_started_at=ASSIGNED_AT or process_started_at(),
            ready_at=ready_at,
            warm=ASSIGNED_AT is not None,
        )
    )

    def skipped(message: str) -> None:
        _warn(message)
        progress.emit(CheckpointSkipped(message=message))

    def memory_skipped(reason: str) -> None:
        _warn(f"the state generation {cfg.generation - 1} held in memory is not used: {reason}")
        progress.emit(HeldStateSkipped(reason=reason))

    groups = make_groups(layout, model, cfg.rank, device, job.peer_timeout_seconds)
    runner = StageRunner(job, layout, cfg.rank, model, groups, device)
    step = 0
    memory = held_mod.take(HELD, cfg, layout, job.identity_hash(), runner, memory_skipped) if cfg.held else None
    _forget_held()
    # Rank 0 verifies the committed checkpoint only when some layer is to be read from it (every rank agrees).
    choice: list[Any] = [None, "", uuid.uuid4().hex[:12]]
    if cfg.rank == 0 and (memory is None or not memory.used or memory.from_disk):
        choice[0], choice[1] = resume.choose(cfg, job.identity(), skipped)
    dist.broadcast_object_list(choice, src=0)
    if choice[1]:
        raise UserInputError(choice[1])
    source = ""  # where the step it starts at comes from (nothing: from scratch)
    if memory is not None and memory.used:
        step = held_mod.apply(memory, runner, choice[0], job.identity())
        memory.payloads.clear()  # the stage has them now
        source = f"memory of generation {cfg.generation - 1}"
    elif choice[0]:
        # Rank 0 verified every file; each rank re-checks the manifest and the files it reads.
        loaded = ckpt_mod.verify(Path(choice[0]), job.identity(), read_files=False)
        runner.load(loaded)
        step, source = loaded.step, str(loaded.path)
    elif reused:  # nothing to resume from, and a past generation trained this model: the initial weights
        warm_model.initial_weights(job, runner)
    if source:
        progress.emit(CheckpointLoaded(step=step, checkpoint=source))
    if cfg.generation > 0 or (source and cfg.rank == 0):  # `spotmorph train` (generation 0): a resume, by rank 0
        _say(f"rank {cfg.rank} of generation {cfg.generation}: resuming from {source or 'scratch'} (step {step})")
    first_step = step
    if cfg.rank == 0:
        write_hf_config(cfg.checkpoint_dir, spec)
    # A checkpoint loaded from elsewhere is written here even when no step is left to train.
    already_written = step if resume.same_directory(choice[0], cfg.checkpoint_dir) else None
    if memory is not None and memory.used and (cfg.resume is None or cfg.resume.step != step):
        already_written = None  # the held step is in memory only: written at once, in the background
    durable_due = step if already_written is None and memory is not None and memory.used else None
    writer = ckpt_mod.CheckpointWriter(
        cfg.checkpoint_dir,
        cfg.rank,
        layout.world_size,
        choice[2],
        job.keep,
        job.background_checkpoint,
        timeout=max(60.0, 3 * job.timeout_seconds),
        generation=cfg.generation,
        fence=fence,
        resumed_from=step,
        acknowledged=control.acknowledged_checkpoint if control is not None else None,
    )

    def manifest() -> dict[str, Any]:
        out: dict[str, Any] = {
            "data_cursor": data_cursor(step, job.global_batch, len(spec.dataset)),
            "job_hash": job.identity_hash(),
            "job": job.identity(),
            "layout": layout.to_dict(),
            "generation": cfg.generation,
            "layer_names": model.layer_names,
        }
        if runner.scaling:
            out["loss_scale"] = runner.loss_scale.to_dict()
        return out

    timeouts = salvage.Timeouts(job.timeout_seconds, job.peer_timeout_seconds)
    timeouts.settle()  # every rank loaded its checkpoint; from here on a silent peer is a lost one
    abort = salvage.AbortWatch(control)
    abort.start()
    last_time = time.perf_counter()
    loss_share = 0.0
    can_hold = job.morph_through_memory and cfg.hold_spool is not None
    try:
        while True:
            stop_flag = 1.0 if stop.requested() else 0.0
            lapsed = 1.0 if lease.lapsed() else 0.0
            fenced = writer.fenced_off()
            leaving = stop.leaving()
            said = (stop_flag, loss_share, requests.contribution(), lapsed, float(bool(fenced)), float(not can_hold))
            flags = torch.tensor([*said, float(leaving)], dtype=torch.float64)
            dist.all_reduce(flags, op=dist.ReduceOp.SUM)
            if flags[4] > 0:
                # A newer generation raised the fence: the controller moved past this one. All ranks stop here.
                message = fenced or "another rank found the checkpoint directory's fence raised past this generation"
                _warn(message)
                progress.emit(TrainerFailed(kind="fenced", message=message))
                return ExitCode.FENCED
            if flags[3] > 0:
                # Some rank's agent stopped renewing its lease: the controller has lost (or will lose) that node, so
                # this generation is over. Every rank stops at this same boundary, without a checkpoint.
                message = lease.explain(step)
                _warn(message)
                progress.emit(TrainerFailed(kind="lease_expired", message=message))
                return ExitCode.LEASE_EXPIRED
            stopping = bool(flags[0] > 0)
            if stopping:  # "leaving" read again after the agreement: one node's ranks see the same stop file
                leaving = stop.leaving()
                count = torch.tensor([float(leaving)], dtype=torch.float64)
                dist.all_reduce(count, op=dist.ReduceOp.SUM)
                flags[6] = count[0]
            requested = requests.requested(float(flags[2]))
            stop_at = time.time()
            now = time.perf_counter()
            if step > first_step:
                progress.emit(
                    StepCompleted(
                        step=step,
                        loss=float(flags[1]),
                        step_seconds=now - last_time,
                        samples_per_second=job.global_batch / (now - last_time),
                        last_checkpoint=writer.last_committed,
                    )
                )
            if step > first_step and job.eval_interval > 0 and step % job.eval_interval == 0:
                started = time.perf_counter()
                eval_loss = runner.evaluate(step)
                seconds = time.perf_counter() - started
                check_eval_loss(eval_loss, step)
                progress.emit(EvaluationCompleted(step=step, eval_loss=eval_loss, eval_seconds=seconds))
                timeouts.settle()
            finishing = stopping or step >= job.steps
            # A rank that may and stays keeps its stage (its tensors; copies on a GPU) for the next generation. When
            # every rank may and one stays, the stop writes nothing: leaving ranks first hand what only they hold
            # to staying ones (handoff.py), and the next generation writes the step in the background.
            holding = stopping and step < job.steps and can_hold and not leaving
            in_memory = stopping and step < job.steps and bool(flags[5] == 0) and bool(flags[6] < layout.world_size)
            write_started = time.perf_counter()
            kept = None
            if in_memory and flags[6] > 0:
                kept = held_mod.keep_stage(runner, job.identity_hash(), cfg.generation, step, cfg.rank)
                handed = hand_off(kept, leaving, layout, cfg.rank)
                in_memory = handed.ok
                _say(f"handed off at step {step}: sent {handed.sent} B, received {handed.received} B")
                if not handed.ok:
                    _warn(f"the hand-off failed ({handed.reason}); the stop writes step {step}")
            interval = job.checkpoint_interval > 0 and step % job.checkpoint_interval == 0
            due = requested or step == durable_due or (not in_memory and (finishing or interval))
            if due and step != already_written:
                writer.wait()  # the previous write is done before new host copies are taken (its buffers reused)
                buffers = runner.host.lease()
                live = step == durable_due and device.type == "cpu"  # no copy: the next update waits for the read
                writer.save(
                    step,
                    runner.payloads(lease=buffers, share=live),
                    manifest() if cfg.rank == 0 else None,
                    done=buffers.release,
                    background=True if step == durable_due else None,
                )
                runner.before_update = writer.files_written if live else None
                if finishing:
                    writer.wait()
                # How long training paused: the copy to host memory, plus the write itself unless in the background.
                stall = time.perf_counter() - write_started
                progress.emit(CheckpointWritten(step=step, last_checkpoint=writer.last_committed, stall_seconds=stall))
                if not finishing:
                    timeouts.settle()  # slower writers catch up before the next step's collectives
            if holding:
                writer.wait()
                _keep(kept or held_mod.keep_stage(runner, job.identity_hash(), cfg.generation, step, cfg.rank))
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
            step += 1
    except Exception as exc:
        abort.stop()
        if not salvage.is_collective_failure(exc):
            raise
        why = abort.explain(exc)
        _warn(f"collective failed after step {step} ({why}); holding step {step} for a just-in-time checkpoint")
        writer.files_written()  # a write still reading the live tensors (after a morph) reads them before anyone else
        keeps = can_hold and not stop.leaving() and step < job.steps
        if keeps:  # for the next generation, should the controller keep the step in memory (stop) not write it
            _keep(held_mod.keep_stage(runner, job.identity_hash(), cfg.generation, step, cfg.rank))
        return salvage.hold(
            kept=keeps,
            rank=cfg.rank,
            generation=cfg.generation,
            stage=runner.stage,
            replica=runner.replica,
            step=step,
            error=why,
            progress=progress,
            control=control,
            root=cfg.checkpoint_dir,
            hold_seconds=max(60.0, 3 * job.timeout_seconds),
            # The pool's free buffers, fresh ones only for what a write in flight still holds.
            payloads=lambda: runner.payloads(list(range(runner.first, runner.last)), runner.host.lease()),
            manifest=manifest,
            fence=writer.fence,
        )
    finally:
        abort.stop()  # every way out of the loop: a fenced, lapsed, finished or crashed rank aborts nothing


def _warn(message: str) -> None:
    print(f"spotmorph trainer: warning: {message}", file=sys.stderr, flush=True)


def _say(message: str) -> None:
    print(f"spotmorph trainer: {message}", file=sys.stderr, flush=True)


def _keep(kept: Held) -> None:
    global KEPT
    KEPT = kept


def _forget_held() -> None:
    global HELD
    HELD = None


def run(cfg: TrainerArguments) -> ExitCode:
    """One generation of this rank: its exit code, with every failure reported as an event first."""
    progress = ProgressLog(cfg.progress_file, cfg.rank, cfg.generation)
    try:
        return train(cfg, progress)
    except UserInputError as exc:  # "node": this node cannot run the job as asked; "input": no node can
        print(f"spotmorph trainer (rank {cfg.rank}): error: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="node" if isinstance(exc, NodeUnfit) else "input", message=str(exc)))
        return ExitCode.USER_ERROR
    except CheckpointWriteFailed as exc:
        print(f"spotmorph trainer (rank {cfg.rank}): error: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="checkpoint", message=str(exc)))
        return ExitCode.CHECKPOINT_NOT_WRITTEN
    except FenceError as exc:
        print(f"spotmorph trainer (rank {cfg.rank}): stopping: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="fenced", message=str(exc)))
        return ExitCode.FENCED
    except CheckpointError as exc:
        # Rank 0 checked sizes and SHA-256, so a file changed since or is no layer file at all (a SHA-256
        # is only as trustworthy as the manifest that lists it).
        message = f"checkpoint cannot be loaded: {exc}; move that step directory aside to resume from the one before"
        print(f"spotmorph trainer (rank {cfg.rank}): error: {message}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="checkpoint_damaged", message=message))
        return ExitCode.ABORTED
    except BaseException as exc:
        traceback.print_exc()
        print(f"spotmorph trainer (rank {cfg.rank}): aborting: {exc!r}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="abort", message=repr(exc)))
        return ExitCode.ABORTED


def main(argv: list[str] | None = None) -> int:
    """Run generations until one ends without state kept for the next (or no next one comes), then exit."""
    global ASSIGNED_AT, HELD, KEPT
    cfg = TrainerArguments.from_argv(argv)
    while True:
        code = run(cfg)
        kept, KEPT = KEPT, None
        if code != ExitCode.SUCCEEDED or kept is None or cfg.hold_spool is None:
            break
        task = held_mod.hold(cfg.hold_spool, kept, PARENT)
        if task is None:
            break
        ASSIGNED_AT = time.time()
        take_over(task)
        cfg, HELD, kept = task.arguments, kept, None  # HELD is dropped once the exchange is done
    sys.stdout.flush()
    sys.stderr.flush()
    if "worker_agent.runtime.comm" in sys.modules:
        from worker_agent.runtime.comm import abort_communicators

        abort_communicators()
    # No destructors: a process group whose peer died can hang in teardown.
    os._exit(code)


if __name__ == "__main__":
    main()
