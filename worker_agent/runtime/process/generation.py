"""One generation of a trainer rank set up: its job, layout, model, stage, where it resumes from, its writer.

:func:`start` does everything before the first step as a sequence of named phases, each a function of what
the ones before it made: read the inputs, take the device, build the model (or take the one a held
generation built), raise the fence, meet the peers, make the groups and the stage, exchange the step the last
generation held in memory, choose the checkpoint to resume from, load, say where it starts, make the writer.
It returns a :class:`Generation`, which :mod:`worker_agent.runtime.process.step_loop` trains. Kept apart so that the
step loop reads as the per-step protocol alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.layout import Layout
from worker_agent.contract import (
    CheckpointLoaded,
    CheckpointSkipped,
    ControlDir,
    TrainerArguments,
)
from worker_agent.contract.hostile import HostileFile, load_json_bounded
from worker_agent.runtime.link.control import CheckpointRequests, LeaseWatch, ProgressLog, StopRequest
from worker_agent.runtime.link.startup import Phase, StartupWatch
from worker_agent.runtime.link.training_log import TrainingLog
from worker_agent.runtime.morph import held as held_mod
from worker_agent.runtime.morph import resume
from worker_agent.runtime.morph.held import Held
from worker_agent.runtime.process import meeting
from worker_agent.runtime.process.trainer_setup import check_eval, say, warn

if TYPE_CHECKING:
    import torch

    from worker_agent.runtime.model.partition import PartitionedModel
    from worker_agent.runtime.morph.salvage import AbortWatch, Timeouts
    from worker_agent.runtime.pipeline.comm import Communicators
    from worker_agent.runtime.pipeline.engine import StageRunner
    from worker_agent.runtime.process.trainer_process import TrainerProcess
    from worker_agent.runtime.storage.checkpoint import CheckpointWriter
    from worker_agent.runtime.storage.fence import Fence


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
    keep: Callable[[Held], None]  # takes the stage this rank keeps for the next generation (the process's)
    communicators: Communicators  # the process's NCCL communicators (a rank holding its step aborts them)
    store: Any = None  # the rendezvous store's Python half: torch holds only its C++ half, this keeps it answering

    def manifest(self) -> dict[str, Any]:
        """Rank 0's manifest of the checkpoint of ``step``."""
        from worker_agent.runtime.numerics.job import data_cursor

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


@dataclass(frozen=True)
class Resumed:
    """Where the generation starts: the step, and where it came from ("": from scratch)."""

    step: int
    source: str


@dataclass(frozen=True)
class Writes:
    """What the generation writes first: a step it need not write (it resumed from it), and the step it writes in
    the background when it resumed from memory only (None otherwise)."""

    already_written: int | None
    durable_due: int | None


def start(cfg: TrainerArguments, progress: ProgressLog, process: TrainerProcess) -> Generation:
    """Everything before the first step; raises :class:`UserInputError` for a job no node can run as asked."""
    from worker_agent.runtime.morph import salvage
    from worker_agent.runtime.pipeline.comm import make_groups
    from worker_agent.runtime.pipeline.engine import StageRunner

    job, layout = read_inputs(cfg)
    device = take_device(job, cfg.device_index)
    model, reused = build_model(process, job, layout, device)
    control = ControlDir(cfg.control_dir) if cfg.control_dir is not None else None
    stop = StopRequest(control)  # SIGTERM and SIGINT from here on are a stop request
    fence = raise_fence(cfg, job, progress)
    with meeting.handed_step(cfg, control, process) as abandoned:
        store = meeting.meet(cfg, job, layout, progress, process.assigned_at, abandoned)
        groups = make_groups(layout, model, cfg.rank, device, job.peer_timeout_seconds, process.communicators)
        runner = StageRunner(job, layout, cfg.rank, model, groups, device, process.masks)
        memory = meeting.exchange_held(cfg, job, layout, runner, progress, process.held)
        chosen = choose_checkpoint(cfg, job, memory, progress)
        resumed = load(cfg, job, layout, runner, memory, chosen, reused, process)
    announce(cfg, job, layout, model, progress, resumed)
    writes = plan_writes(cfg, job, resumed.step, memory, chosen)
    writer = make_writer(cfg, job, layout, chosen.write_id, fence, resumed.step, control)
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
        requests=CheckpointRequests(control, cfg.rank),
        lease=LeaseWatch(control),
        timeouts=timeouts,
        abort=salvage.AbortWatch(control, process.communicators),
        step=resumed.step,
        first_step=resumed.step,
        already_written=writes.already_written,
        durable_due=writes.durable_due,
        can_hold=job.morph_through_memory and cfg.hold_spool is not None,
        keep=process.keep,
        communicators=process.communicators,
        store=store,
    )


def read_inputs(cfg: TrainerArguments) -> tuple[JobSpec, Layout]:
    """The job and the layout, checked against each other and this rank (the user's input: exit 2)."""
    from worker_agent.runtime.numerics.job import MAX_INPUT_BYTES, load_job_spec

    job = load_job_spec(cfg.job_file)
    try:
        layout = Layout.from_dict(load_json_bounded(cfg.layout_file, MAX_INPUT_BYTES))
    except (OSError, HostileFile) as exc:
        raise UserInputError(f"cannot read layout {cfg.layout_file}: {exc}") from exc
    if layout.global_batch != job.global_batch:
        raise UserInputError(f"layout global_batch={layout.global_batch} but job has {job.global_batch}")
    if not 0 <= cfg.rank < layout.world_size:
        raise UserInputError(f"rank {cfg.rank} is outside the layout's {layout.world_size} ranks")
    return job, layout


def take_device(job: JobSpec, device_index: int | None) -> torch.device:
    """The rank's device, with the threads, NCCL's settings and determinism the job asks of it."""
    import torch

    from worker_agent.runtime.numerics.device import resolve_device
    from worker_agent.runtime.pipeline.comm import configure_nccl

    device = resolve_device(job.device, device_index)
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
    return device


def build_model(
    process: TrainerProcess, job: JobSpec, layout: Layout, device: torch.device
) -> tuple[PartitionedModel, bool]:
    """The model (the one a held generation of this job built, if any: then True), its eval data checked and its
    dropout kernels warmed up for the dtypes it runs in."""
    from worker_agent.runtime.model.model_api import dropout_dtypes
    from worker_agent.runtime.numerics.device import autocast_dtype
    from worker_agent.runtime.numerics.dropout import warm_up as warm_up_dropout
    from worker_agent.runtime.numerics.job import torch_dtype

    model, reused = process.models.model_for(job, layout, device)
    check_eval(model.spec, job.eval_interval)
    dtypes = dropout_dtypes(model.spec, torch_dtype(job.dtype), autocast_dtype(job.precision))
    warm_up_dropout(device, dtypes, process.masks)
    return model, reused


def raise_fence(cfg: TrainerArguments, job: JobSpec, progress: ProgressLog) -> Fence | None:
    """The checkpoint dir's fence, raised before the rendezvous (before this generation loads anything), within
    a watchdog's limit: the lock is on a share other hosts hold."""
    with StartupWatch(progress, cfg.rank).phase(Phase.FENCE, max(60.0, 3 * job.timeout_seconds)):
        return resume.fence_of(cfg)


def choose_checkpoint(
    cfg: TrainerArguments, job: JobSpec, memory: held_mod.Outcome | None, progress: ProgressLog
) -> ResumeChoice:
    """Rank 0's choice, broadcast (a collective). Rank 0 chooses only when some layer is to be read from a
    checkpoint (every rank agrees); it reads every file only when it must choose among several (standalone),
    else each rank checks the files it loads."""
    import torch.distributed as dist

    def skipped(message: str) -> None:
        warn(message)
        progress.emit(CheckpointSkipped(message=message))

    choice = [ResumeChoice(None, "", uuid.uuid4().hex[:12])]
    if cfg.rank == 0 and (memory is None or not memory.used or memory.from_disk):
        checkpoint, refusal = resume.choose(cfg, job.identity(), skipped)
        choice = [ResumeChoice(checkpoint, refusal, choice[0].write_id)]
    dist.broadcast_object_list(choice, src=0)
    chosen: ResumeChoice = choice[0]
    if chosen.refusal:
        raise UserInputError(chosen.refusal)
    return chosen


def load(
    cfg: TrainerArguments,
    job: JobSpec,
    layout: Layout,
    runner: StageRunner,
    memory: held_mod.Outcome | None,
    chosen: ResumeChoice,
    reused: bool,
    process: TrainerProcess,
) -> Resumed:
    """The stage's state: from memory (and the disk for what no survivor held), from the checkpoint, or the
    initial weights (a reused model a past generation trained); a collective when anything is loaded."""
    path = chosen.checkpoint
    # Let go of the held step before loading: the stage adopts its tensors (they are not the held step any more),
    # and a load from the disk beside a whole held stage would need twice the stage's memory.
    process.forget_held()
    if memory is not None and memory.used:
        used = memory
        step = resume.loaded_by_all(lambda: held_mod.apply(used, runner, path, job.identity()), path, layout.world_size)
        memory.payloads.clear()  # the stage has them now
        assert cfg.held is not None  # memory is used only for the held step the assignment named
        return Resumed(step, f"memory of generation {cfg.held.generation}")
    if path:  # each rank checks the manifest and the files it reads (rank 0 read every file only if it had to choose)
        return Resumed(resume.loaded_by_all(lambda: _load(runner, path, job), path, layout.world_size), path)
    if reused:  # nothing to resume from, and a past generation trained this model: the initial weights
        from worker_agent.runtime.process.warm_model import initial_weights

        initial_weights(job, runner)
    return Resumed(0, "")


def announce(
    cfg: TrainerArguments, job: JobSpec, layout: Layout, model: PartitionedModel, progress: ProgressLog, at: Resumed
) -> None:
    """Say where the generation starts (an event, and a log line); rank 0 writes the Hugging Face config and
    keeps the training log."""
    from worker_agent.runtime.model.hf_export import write_config as write_hf_config

    if at.source:
        progress.emit(CheckpointLoaded(step=at.step, checkpoint=at.source))
    if cfg.generation > 0 or (at.source and cfg.rank == 0):  # `spotmorph train` (generation 0): a resume, by rank 0
        say(f"rank {cfg.rank} of generation {cfg.generation}: resuming from {at.source or 'scratch'} (step {at.step})")
    if cfg.rank == 0:
        write_hf_config(cfg.checkpoint_dir, model.spec)
        progress.lines = TrainingLog(job.log_interval, job.steps, layout.describe())


def plan_writes(
    cfg: TrainerArguments, job: JobSpec, step: int, memory: held_mod.Outcome | None, chosen: ResumeChoice
) -> Writes:
    """Pure: which step need not be written, and which is written first, in the background.

    A checkpoint loaded from elsewhere is written here even when no step is left to train. Resumed from memory
    only, the step after the held one is written, in the background, once this generation's first step is done,
    not beside that step (on a busy host the write shares its cores with the step that ends the morph's pause);
    until then every rank holds the step in memory, as the stopped generation did."""
    already_written = step if resume.same_directory(chosen.checkpoint, cfg.checkpoint_dir) else None
    from_memory = memory is not None and memory.used
    if from_memory and (cfg.resume is None or cfg.resume.step != step):
        already_written = None  # the held step is in memory only: written at once, in the background
    if already_written is None and from_memory:
        return Writes(None, step + 1 if step < job.steps else step)
    return Writes(already_written, None)


def make_writer(
    cfg: TrainerArguments,
    job: JobSpec,
    layout: Layout,
    write_id: str,
    fence: Fence | None,
    step: int,
    control: ControlDir | None,
) -> CheckpointWriter:
    """This rank's checkpoint writer for the generation (every write checks ``fence``)."""
    from worker_agent.runtime.storage.checkpoint import CheckpointWriter

    return CheckpointWriter(
        cfg.checkpoint_dir,
        cfg.rank,
        layout.world_size,
        write_id,
        job.keep,
        job.background_checkpoint,
        timeout=max(60.0, 3 * job.timeout_seconds),
        generation=cfg.generation,
        fence=fence,
        resumed_from=step,
        acknowledged=control.acknowledged_checkpoint if control is not None else None,
        job_hash=job.identity_hash(),
    )


def _load(runner: StageRunner, checkpoint: str, job: JobSpec) -> int:
    """This rank's stage from ``checkpoint``: its manifest and the files the stage reads, checked on the way."""
    from worker_agent.runtime.storage import checkpoint as ckpt_mod

    loaded = ckpt_mod.verify(Path(checkpoint), job.identity(), read_files=False)
    runner.load(loaded)
    return loaded.step
