"""One generation of a trainer rank set up: its job, layout, model, stage, where it resumes from, its writer.

:func:`start` does everything before the first step (the device, the model or the one a held generation
built, the fence, the rendezvous, the exchange of a step the last generation held in memory, the checkpoint
to resume from, the writer) and returns a :class:`Generation`, which :mod:`worker_agent.runtime.step_loop`
trains. Kept apart so that the step loop reads as the per-step protocol alone.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.layout import Layout
from morphing.transfer import HeldSkipCause
from worker_agent.contract import (
    CheckpointLoaded,
    CheckpointSkipped,
    ControlDir,
    HeldStateSkipped,
    TrainerArguments,
    TrainerStarted,
)
from worker_agent.contract.hostile import HostileFile, load_json_bounded
from worker_agent.runtime import held as held_mod
from worker_agent.runtime import resume
from worker_agent.runtime.control import CheckpointRequests, LeaseWatch, ProgressLog, StopRequest
from worker_agent.runtime.held import Held
from worker_agent.runtime.startup import Phase, StartupWatch
from worker_agent.runtime.trainer_setup import check_eval, process_started_at, rendezvous, say, warn
from worker_agent.runtime.training_log import TrainingLog

if TYPE_CHECKING:
    import torch

    from worker_agent.runtime.checkpoint import CheckpointWriter
    from worker_agent.runtime.engine import StageRunner
    from worker_agent.runtime.partition import PartitionedModel
    from worker_agent.runtime.salvage import AbortWatch, Timeouts


@dataclass(frozen=True)
class ResumeChoice:
    """Rank 0's choice, broadcast to every rank: the checkpoint to resume from (None: from scratch, or all from
    memory), why none can be used (a user error; empty otherwise) and the id this generation's writes share."""

    checkpoint: str | None
    refusal: str
    write_id: str


@dataclass
class Generation:
    """What the step loop trains with: set up once, ``step`` the only field that moves."""

    cfg: TrainerArguments
    job: JobSpec
    layout: Layout
    device: torch.device
    model: PartitionedModel
    runner: StageRunner
    writer: CheckpointWriter
    progress: ProgressLog
    control: ControlDir | None
    stop: StopRequest
    requests: CheckpointRequests
    lease: LeaseWatch
    timeouts: Timeouts
    abort: AbortWatch
    step: int  # steps completed: where it resumed, then each one it trains
    first_step: int  # where it resumed
    already_written: int | None  # a step whose checkpoint this generation need not write (it resumed from it)
    durable_due: int | None  # resumed from memory only: the step it writes first, in the background
    can_hold: bool  # this rank may keep its stage in memory at a stop (the job morphs through memory)
    store: Any = None  # the rendezvous store's Python half: torch holds only its C++ half, this keeps it answering

    def manifest(self) -> dict[str, Any]:
        """Rank 0's manifest of the checkpoint of ``step``."""
        from worker_agent.runtime.job import data_cursor

        out: dict[str, Any] = {
            "data_cursor": data_cursor(self.step, self.job.global_batch, len(self.model.spec.dataset)),
            "job_hash": self.job.identity_hash(),
            "job": self.job.identity(),
            "layout": self.layout.to_dict(),
            "generation": self.cfg.generation,
            "layer_names": self.model.layer_names,
        }
        if self.runner.scaling:
            out["loss_scale"] = self.runner.loss_scale.to_dict()
        return out


def start(
    cfg: TrainerArguments,
    progress: ProgressLog,
    held: Held | None,
    forget_held: Callable[[], None],
    assigned_at: float | None,
) -> Generation:
    """Everything before the first step; raises :class:`UserInputError` for a job no node can run as asked."""
    import torch
    import torch.distributed as dist

    from worker_agent.runtime import checkpoint as ckpt_mod
    from worker_agent.runtime import salvage, warm_model
    from worker_agent.runtime.comm import configure_nccl, make_groups
    from worker_agent.runtime.device import autocast_dtype, resolve_device
    from worker_agent.runtime.dropout import warm_up as warm_up_dropout
    from worker_agent.runtime.engine import StageRunner
    from worker_agent.runtime.hf_export import write_config as write_hf_config
    from worker_agent.runtime.job import MAX_INPUT_BYTES, load_job_spec, torch_dtype
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
    stop = StopRequest(control)  # SIGTERM and SIGINT from here on are a stop request
    requests = CheckpointRequests(control, cfg.rank)
    lease = LeaseWatch(control)
    with StartupWatch(progress, cfg.rank).phase(Phase.FENCE, max(60.0, 3 * job.timeout_seconds)):
        fence = resume.fence_of(cfg)  # before the rendezvous: before this generation loads anything
    ready_at = time.time()  # torch imported, model built: what a cold start costs before the rendezvous
    store = rendezvous(cfg, layout.world_size, job.timeout_seconds)
    progress.emit(
        TrainerStarted(
            layout=layout.describe(),
            process_started_at=assigned_at or process_started_at(),
            ready_at=ready_at,
            warm=assigned_at is not None,
        )
    )

    def skipped(message: str) -> None:
        warn(message)
        progress.emit(CheckpointSkipped(message=message))

    def memory_skipped(cause: HeldSkipCause, reason: str) -> None:
        warn(f"the state generation {cfg.generation - 1} held in memory is not used: {reason}")
        progress.emit(HeldStateSkipped(reason=reason, cause=cause.value))

    groups = make_groups(layout, model, cfg.rank, device, job.peer_timeout_seconds)
    runner = StageRunner(job, layout, cfg.rank, model, groups, device)
    step = 0
    memory = held_mod.take(held, cfg, layout, job.identity_hash(), runner, memory_skipped) if cfg.held else None
    forget_held()
    # Rank 0 chooses the checkpoint only when some layer is to be read from it (every rank agrees); it reads every
    # file only when it must choose among several (standalone), else each rank checks the files it loads.
    choice = [ResumeChoice(None, "", uuid.uuid4().hex[:12])]
    if cfg.rank == 0 and (memory is None or not memory.used or memory.from_disk):
        checkpoint, refusal = resume.choose(cfg, job.identity(), skipped)
        choice = [ResumeChoice(checkpoint, refusal, choice[0].write_id)]
    dist.broadcast_object_list(choice, src=0)
    chosen: ResumeChoice = choice[0]
    if chosen.refusal:
        raise UserInputError(chosen.refusal)
    source = ""  # where the step it starts at comes from (nothing: from scratch)
    if memory is not None and memory.used:
        used, path = memory, chosen.checkpoint
        step = resume.loaded_by_all(lambda: held_mod.apply(used, runner, path, job.identity()), path, layout.world_size)
        memory.payloads.clear()  # the stage has them now
        source = f"memory of generation {cfg.generation - 1}"
    elif chosen.checkpoint:
        # Each rank checks the manifest and the files it reads (rank 0 read every file only if it had to choose).
        path = chosen.checkpoint
        step = resume.loaded_by_all(lambda: _load(runner, path, job), path, layout.world_size)
        source = chosen.checkpoint
    elif reused:  # nothing to resume from, and a past generation trained this model: the initial weights
        warm_model.initial_weights(job, runner)
    if source:
        progress.emit(CheckpointLoaded(step=step, checkpoint=source))
    if cfg.generation > 0 or (source and cfg.rank == 0):  # `spotmorph train` (generation 0): a resume, by rank 0
        say(f"rank {cfg.rank} of generation {cfg.generation}: resuming from {source or 'scratch'} (step {step})")
    if cfg.rank == 0:
        write_hf_config(cfg.checkpoint_dir, spec)
        progress.lines = TrainingLog(job.log_interval, job.steps, layout.describe())
    # A checkpoint loaded from elsewhere is written here even when no step is left to train.
    already_written = step if resume.same_directory(chosen.checkpoint, cfg.checkpoint_dir) else None
    if memory is not None and memory.used and (cfg.resume is None or cfg.resume.step != step):
        already_written = None  # the held step is in memory only: written at once, in the background
    # Resumed from memory only: the step after the held one is written, in the background, once this generation's
    # first step is done, not beside that step (on a busy host the write shares its cores with the step that ends
    # the morph's pause). Until then every rank holds the step in memory, as the stopped generation did.
    from_memory_only = already_written is None and memory is not None and memory.used
    durable_due = (step + 1 if step < job.steps else step) if from_memory_only else None
    writer = ckpt_mod.CheckpointWriter(
        cfg.checkpoint_dir,
        cfg.rank,
        layout.world_size,
        chosen.write_id,
        job.keep,
        job.background_checkpoint,
        timeout=max(60.0, 3 * job.timeout_seconds),
        generation=cfg.generation,
        fence=fence,
        resumed_from=step,
        acknowledged=control.acknowledged_checkpoint if control is not None else None,
        job_hash=job.identity_hash(),
    )
    timeouts = salvage.Timeouts(job.timeout_seconds, job.peer_timeout_seconds)
    timeouts.settle()  # every rank loaded its checkpoint; from here on a silent peer is a lost one
    return Generation(
        cfg=cfg,
        job=job,
        layout=layout,
        device=device,
        model=model,
        runner=runner,
        writer=writer,
        progress=progress,
        control=control,
        stop=stop,
        requests=requests,
        lease=lease,
        timeouts=timeouts,
        abort=salvage.AbortWatch(control),
        step=step,
        first_step=step,
        already_written=already_written,
        durable_due=durable_due,
        can_hold=job.morph_through_memory and cfg.hold_spool is not None,
        store=store,
    )


def _load(runner: StageRunner, checkpoint: str, job: JobSpec) -> int:
    """This rank's stage from ``checkpoint``: its manifest and the files the stage reads, checked on the way."""
    from worker_agent.runtime import checkpoint as ckpt_mod

    loaded = ckpt_mod.verify(Path(checkpoint), job.identity(), read_files=False)
    runner.load(loaded)
    return loaded.step
