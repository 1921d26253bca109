"""What agents send, checked before it reaches the runner: every field in its range and against its job.

A report names jobs this controller issued, generations it issued, ranks its layout has, and steps
the job has; a number that cannot be stored, a NaN time or a step past the job's last is refused here
(INVALID_ARGUMENT naming the field), so it never becomes an observation a decision could fail on.
Reports of unknown jobs are NOT_FOUND, of generations never issued FAILED_PRECONDITION; neither is
kept or decided on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from controller.api import wire
from controller.core.intake import Full, Stale
from controller.core.model import JobRecord, RankReport
from controller.core.observations import EvictionRisk
from controller.shell.views import StateView
from morphing.transfer import HeldSkipCause
from morphing.validation import (
    MAX_JOB_ID,
    MAX_LOSS,
    MAX_PATH_LENGTH,
    MAX_SAMPLES_PER_SECOND,
    MAX_STALL_SECONDS,
    InvalidField,
    check_address,
    check_finite,
    check_name,
    check_step,
    check_text,
    check_time,
    is_duration,
    is_rate,
    is_stall,
    printable,
    shown,
)
from protos.spotmorph.v1 import controller_pb2 as pb

MAX_TRAINERS = 4096  # trainers one node reports (or one node's reports add up to)
MAX_SLOTS = 1024
MAX_ERROR_CHARACTERS = 2000  # a trainer's error (its message or its log's tail) is cut to this
MAX_INSTANCE_ID = 256
MAX_CLOCK_SKEW_SECONDS = 300.0  # how far a node's clock may run ahead of the controller's


def known_job(view: StateView, field: str, job_id: str) -> JobRecord:
    """The job a report names; NOT_FOUND for a job this controller never had."""
    check_name(field, job_id, MAX_JOB_ID)
    job = view.job(job_id)
    if job is None:
        raise LookupError(f"{field}: job {shown(job_id)} not found; report only jobs this controller assigned")
    return job


def issued(job: JobRecord, field: str, generation: int) -> None:
    if generation > job.generation:
        raise Stale(f"{field}: job {job.id} generation {generation} was never issued (newest {job.generation})")


def trainer(view: StateView, node: str, field: str, status: pb.TrainerStatus) -> RankReport:
    """One trainer's status as a rank report, every field checked against its job.

    A rank of the current generation must be one the layout placed on ``node``: the census counts
    each rank once, so a node must not speak for another node's ranks.
    """
    job = known_job(view, f"{field}.job", status.job)
    issued(job, field, status.generation)
    layout = job.layout if status.generation == job.generation else None
    if layout is not None and (status.rank >= layout.world_size or layout.placement[status.rank].node != node):
        raise InvalidField(f"{field}.rank", f"generation {job.generation} placed no rank {status.rank} on {node}")
    check_step(f"{field}.last_step", status.last_step, job.spec.steps)
    if status.last_checkpoint_step > status.last_step:
        raise InvalidField(
            f"{field}.last_checkpoint_step",
            f"checkpoint step {status.last_checkpoint_step} is past the rank's last_step {status.last_step}",
        )
    evaluation(field, status)
    training(field, status)
    checkpoint_stall(field, status)
    step_times(field, status, view.now())
    if status.HasField("held_step"):
        if not status.last_step <= status.held_step <= status.last_step + 1:
            raise InvalidField(
                f"{field}.held_step",
                f"a rank holds its last completed step, {status.last_step}, or the one in flight, "
                f"not {status.held_step}",
            )
        check_step(f"{field}.held_step", status.held_step, job.spec.steps)
    snapshots(field, status)
    skipped = printable(status.held_skipped, MAX_ERROR_CHARACTERS)
    causes = [str(cause) for cause in HeldSkipCause]
    if status.held_skipped_cause and (status.held_skipped_cause not in causes or not skipped):
        raise InvalidField(
            f"{field}.held_skipped_cause",
            f"one of {', '.join(causes)}, beside held_skipped's words (or empty), "
            f"not {status.held_skipped_cause[:40]!r}",
        )
    handed = printable(status.hand_off_failed, MAX_ERROR_CHARACTERS)
    return wire.rank_from_pb(status, printable(status.error, MAX_ERROR_CHARACTERS), skipped, handed)


def evaluation(field: str, status: pb.TrainerStatus) -> None:
    """An evaluation is a finite loss after a step the rank finished (no loss: no step, and the other way round)."""
    has_loss = status.HasField("eval_loss")
    if status.eval_step > status.last_step:
        raise InvalidField(
            f"{field}.eval_step", f"step {status.eval_step} is past the rank's last_step {status.last_step}"
        )
    if has_loss != (status.eval_step > 0):
        raise InvalidField(f"{field}.eval_loss", "an evaluation needs both eval_loss and its eval_step (>= 1)")
    if has_loss:
        check_finite(f"{field}.eval_loss", status.eval_loss, MAX_LOSS)


def training(field: str, status: pb.TrainerStatus) -> None:
    """The last step's loss (finite, within +-MAX_LOSS) and samples/s (0 up to MAX_SAMPLES_PER_SECOND), once a
    step was done."""
    for name in ("loss", "samples_per_second"):
        if status.HasField(name) and status.last_step < 1:
            raise InvalidField(f"{field}.{name}", "a measurement of a step needs last_step >= 1")
    if status.HasField("loss"):
        check_finite(f"{field}.loss", status.loss, MAX_LOSS)
    if status.HasField("samples_per_second") and not is_rate(status.samples_per_second):
        raise InvalidField(
            f"{field}.samples_per_second",
            f"{status.samples_per_second!r} is not a rate from 0 to {MAX_SAMPLES_PER_SECOND:g} samples/s",
        )


def checkpoint_stall(field: str, status: pb.TrainerStatus) -> None:
    """How long the rank's newest checkpoint paused training: seconds (0 up to a week), at a step it reached."""
    if status.checkpoint_stall_step > status.last_step:
        raise InvalidField(
            f"{field}.checkpoint_stall_step",
            f"step {status.checkpoint_stall_step} is past the rank's last_step {status.last_step}",
        )
    if not status.HasField("checkpoint_stall_seconds"):
        if status.checkpoint_stall_step > 0:
            raise InvalidField(
                f"{field}.checkpoint_stall_seconds", "a checkpoint's step needs its checkpoint_stall_seconds too"
            )
        return
    seconds = status.checkpoint_stall_seconds
    if not is_stall(seconds):
        raise InvalidField(
            f"{field}.checkpoint_stall_seconds",
            f"{seconds!r} is not how long a checkpoint paused training; give seconds (0..{MAX_STALL_SECONDS:g})",
        )


def step_times(field: str, status: pb.TrainerStatus, now: float | None = None) -> None:
    """Wall-clock times of the rank's first and newest step: unix seconds, the first not after the newest, and
    neither later than the controller's clock ``now`` by more than :data:`MAX_CLOCK_SKEW_SECONDS` (one far-future
    time once stuck to the job, and every later pause read 0 s)."""
    first = status.first_step_at if status.HasField("first_step_at") else None
    last = status.last_step_at if status.HasField("last_step_at") else None
    for name, value in (("first_step_at", first), ("last_step_at", last)):
        if value is None:
            continue
        check_time(f"{field}.{name}", value)
        if now is not None and value > now + MAX_CLOCK_SKEW_SECONDS:
            raise InvalidField(
                f"{field}.{name}",
                f"{value!r} is {value - now:.0f} s after the controller's clock, more than the "
                f"{MAX_CLOCK_SKEW_SECONDS:g} s of skew it allows; set the node's clock right (NTP)",
            )
    if first is not None and (last is None or first > last):
        raise InvalidField(f"{field}.first_step_at", f"{first!r} needs a last_step_at at or after it (got {last!r})")
    if status.HasField("first_step_seconds"):
        took = status.first_step_seconds
        if first is None:
            raise InvalidField(f"{field}.first_step_seconds", "how long the first step took needs its first_step_at")
        if not is_duration(took) or took > first:
            raise InvalidField(
                f"{field}.first_step_seconds",
                f"{took!r} is not how long the first step took; give seconds (0..{MAX_STALL_SECONDS:g})",
            )


def trainers(view: StateView, node: str, statuses: Any) -> tuple[RankReport, ...]:
    """A heartbeat's trainers: at most :data:`MAX_TRAINERS`, each rank once."""
    if len(statuses) > MAX_TRAINERS:
        raise InvalidField("trainers", f"{len(statuses)} trainers; a node reports at most {MAX_TRAINERS}")
    ranks = tuple(trainer(view, node, f"trainers[{i}]", status) for i, status in enumerate(statuses))
    return once_each(ranks)


def once_each(ranks: Iterable[RankReport]) -> tuple[RankReport, ...]:
    seen: set[tuple[str, int, int]] = set()
    for r in ranks:
        key = (r.job, r.generation, r.rank)
        if key in seen:
            raise InvalidField("trainers", f"job {r.job} generation {r.generation} rank {r.rank} is reported twice")
        seen.add(key)
    return tuple(ranks)


def exited(
    view: StateView, node: str, status: pb.TrainerStatus, others: tuple[RankReport, ...]
) -> tuple[RankReport, ...]:
    """The node's ranks with this exited one replacing its earlier report; bounded like a heartbeat's."""
    rank = trainer(view, node, "trainer_exited.trainer", status)
    if rank.running:
        raise InvalidField("trainer_exited.trainer.running", "an exited trainer is not running; set running=false")
    kept = tuple(r for r in others if (r.job, r.generation, r.rank) != (rank.job, rank.generation, rank.rank))
    if len(kept) >= MAX_TRAINERS:
        raise Full(f"trainer_exited: this node already reports {len(kept)} trainers, the most it may")
    return (*kept, rank)


def collective_failed(
    view: StateView, node: str, message: pb.CollectiveFailed, others: tuple[RankReport, ...]
) -> tuple[RankReport, ...]:
    """The node's ranks with this holding one replacing its earlier report; its stage and replica must be
    the ones the current layout gives its rank (an older generation's report is kept and fenced later)."""
    field = "collective_failed.trainer"
    rank = trainer(view, node, field, message.trainer)
    if rank.held_step is None or not rank.running:
        raise InvalidField(field, "a rank whose collective failed is running and holds a step; set held_step")
    job = known_job(view, f"{field}.job", rank.job)
    if rank.generation == job.generation and job.layout is not None:
        replica, stage = job.layout.coords(rank.rank)
        if (message.stage, message.replica) != (stage, replica):
            raise InvalidField(
                "collective_failed.stage",
                f"rank {rank.rank} is stage {stage}, replica {replica} of generation {job.generation}, "
                f"not stage {message.stage}, replica {message.replica}",
            )
    kept = tuple(r for r in others if (r.job, r.generation, r.rank) != (rank.job, rank.generation, rank.rank))
    if len(kept) >= MAX_TRAINERS:
        raise Full(f"collective_failed: this node already reports {len(kept)} trainers, the most it may")
    return (*kept, rank)


def building(view: StateView, job_id: str) -> str:
    """The job a free node reports its warm trainer building ahead; a name that is no job's id is refused, and
    a job this controller no longer has (it ended since the hint) is dropped: the build is only an optimisation."""
    if not job_id:
        return ""
    check_name("building", job_id, MAX_JOB_ID)
    return job_id if view.job(job_id) is not None else ""


MAX_WAIT_SECONDS = 5.0  # a heartbeat held longer could outlast the agent's call timeout


def wait_seconds(value: float) -> float:
    """How long the agent lets the controller hold its heartbeat's reply: 0 to :data:`MAX_WAIT_SECONDS`."""
    if not math.isfinite(value) or not 0.0 <= value <= MAX_WAIT_SECONDS:
        raise InvalidField("wait_seconds", f"{value!r}: give 0 to {MAX_WAIT_SECONDS:g} seconds (0: answer at once)")
    return value


MAX_RISK_SOURCE = 128  # characters of an eviction risk's source ("aws-rebalance-recommendation", ...)


def risk(message: pb.EvictionRisk, now: float) -> EvictionRisk:
    """The cloud's warning that the node may be evicted soon: a source in words (printable, bounded; "" names
    none) and when the agent first saw it, a time no later than the controller's clock allows (as step times)."""
    source = check_text("risk.source", message.source, MAX_RISK_SOURCE)
    noticed_at = check_time("risk.noticed_at", message.noticed_at)
    if noticed_at > now + MAX_CLOCK_SKEW_SECONDS:
        raise InvalidField(
            "risk.noticed_at",
            f"{noticed_at!r} is {noticed_at - now:.0f} s after the controller's clock, more than the "
            f"{MAX_CLOCK_SKEW_SECONDS:g} s of skew it allows; set the node's clock right (NTP)",
        )
    return EvictionRisk(noticed_at, source)


def notice(field: str, message: pb.EvictionNotice) -> float:
    check_text(f"{field}.source", message.source, MAX_INSTANCE_ID)
    return check_time(f"{field}.not_before", message.not_before)


def checkpoint(view: StateView, node: str, message: pb.CheckpointCommitted) -> None:
    """A committed checkpoint of a known job, within its steps, from a node the job runs on.

    The generation is fenced by the decision; a node outside the job's layout could otherwise move the
    step the next generation resumes from to a checkpoint that does not exist.
    """
    job = known_job(view, "checkpoint_committed.job", message.job)
    issued(job, "checkpoint_committed", message.generation)
    layout = job.layout if message.generation == job.generation else None  # older ones: Stale, decided below
    if layout is not None and node not in layout.nodes():
        raise InvalidField(
            "checkpoint_committed.job", f"{node} runs no rank of {job.id} generation {message.generation}"
        )
    check_step("checkpoint_committed.step", message.step, job.spec.steps)
    check_text("checkpoint_committed.path", message.path, MAX_PATH_LENGTH)


def registration(request: pb.RegisterRequest) -> None:
    """A registration's fields: its name in full, slots in range, an address others reach, a printable instance id."""
    if not 1 <= request.slots <= MAX_SLOTS:
        raise InvalidField("slots", f"{request.slots}: use 1..{MAX_SLOTS}")
    if request.node_name:
        check_name("node_name", request.node_name)
    check_address("address", request.address)
    check_text("instance_id", request.instance_id, MAX_INSTANCE_ID)


MAX_SNAPSHOT_STEPS = 4  # a trainer keeps two peer snapshots (morphing.snapshots.KEPT_SNAPSHOTS)


def snapshots(field: str, status: pb.TrainerStatus) -> None:
    """The peer snapshots a held rank lists: a few steps, none past the step it holds; none without a held step."""
    for name in ("snapshot_own_steps", "snapshot_received_steps"):
        steps = list(getattr(status, name))
        if steps and not status.HasField("held_step"):
            raise InvalidField(f"{field}.{name}", "only a rank that holds a step (held_step) lists peer snapshots")
        if len(steps) > MAX_SNAPSHOT_STEPS or any(s > status.held_step for s in steps):
            raise InvalidField(
                f"{field}.{name}", f"at most {MAX_SNAPSHOT_STEPS} steps, none past held_step {status.held_step}"
            )
