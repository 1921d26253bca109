"""What a trainer's progress file says, folded into facts the agent reports (pure; the supervisor reads the files)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from morphing.transfer import HeldSkipCause
from worker_agent.agent.converge import TrainerStatus
from worker_agent.contract import (
    CheckpointLoaded,
    CheckpointWritten,
    CollectiveFailed,
    EvaluationCompleted,
    FailureKind,
    HandOffFailed,
    HeldStateSkipped,
    ProgressRecord,
    SalvageWritten,
    StepCompleted,
    TrainerFailed,
    TrainingFinished,
    TrainingStopped,
)


@dataclass(frozen=True)
class Held:
    """A trainer whose collective failed: where it sits in the layout and the step it holds in memory."""

    stage: int
    replica: int
    step: int
    snapshot_own: tuple[int, ...] = ()  # the steps of the peer snapshots of its own stage it keeps ...
    snapshot_received: tuple[int, ...] = ()  # ... and of those it received whole


MAX_SNAPSHOT_STEPS = 4  # a trainer keeps two (morphing.snapshots.KEPT_SNAPSHOTS); more is not believed


def snapshot_steps(said: object) -> tuple[int, ...]:
    """The steps a trainer's file lists (hostile: any JSON value): non-negative integers, a few, sorted."""
    if not isinstance(said, list) or len(said) > MAX_SNAPSHOT_STEPS:
        return ()
    return tuple(sorted({v for v in said if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62}))


@dataclass(frozen=True)
class TrainerProgress:
    """What a trainer's progress file has said so far, folded into the latest facts."""

    step: int = 0
    loss: float | None = None
    samples_per_second: float | None = None
    last_checkpoint_step: int | None = None
    stepped: bool = False
    loaded: bool = False  # it said where it resumed from: a step it was handed from memory is its stage's now
    finished: bool = False
    error: str = ""
    failure: FailureKind | None = None  # what kind of failure the trainer said it exits with
    eval_step: int = 0  # the step of the newest evaluation (0: none yet)
    eval_loss: float | None = None
    first_step_at: float | None = None  # the trainer's wall clock when it completed its first step
    first_step_seconds: float | None = None  # ... how long that step took (the trainer's word: fit() bounds it)
    last_step_at: float | None = None  # ... and its newest one
    held: Held | None = None
    stall_step: int = 0  # the step of the newest checkpoint that reported its stall
    stall_seconds: float | None = None  # how long that checkpoint paused training (None: none reported yet)
    held_skipped: str = ""  # why the state the previous generation held in memory was not used
    held_skipped_cause: str = ""  # its class, a HeldSkipCause value ("" from a trainer that names none)
    hand_off_failed: str = ""  # why the layers leaving ranks handed over at this generation's stop were not used


def absorb(progress: TrainerProgress, record: ProgressRecord) -> TrainerProgress:
    """``progress`` updated with one more record (pure: the supervisor's reading of the contract)."""
    event = record.event
    if isinstance(event, StepCompleted):
        first, took = progress.first_step_at, progress.first_step_seconds
        if first is None:
            first, took = record.time, seconds_or_none(event.step_seconds)
        progress = replace(
            progress,
            step=event.step,
            loss=event.loss,
            samples_per_second=event.samples_per_second,
            stepped=True,
            first_step_at=first,
            first_step_seconds=took,
            last_step_at=record.time,
        )
    elif isinstance(event, EvaluationCompleted):
        progress = replace(progress, eval_step=event.step, eval_loss=event.eval_loss)
    elif isinstance(event, HeldStateSkipped):
        said = event.cause  # a trainer's file: hostile (any JSON value)
        cause = said if isinstance(said, str) and said in set(HeldSkipCause) else ""
        progress = replace(progress, held_skipped=str(event.reason), held_skipped_cause=cause)
    elif isinstance(event, HandOffFailed):
        progress = replace(progress, hand_off_failed=str(event.reason))
    elif isinstance(event, CheckpointLoaded):
        progress = replace(progress, step=event.step, loaded=True)
    elif isinstance(event, CheckpointWritten | TrainingStopped | TrainingFinished):
        progress = replace(progress, step=event.step, finished=progress.finished or isinstance(event, TrainingFinished))
        if isinstance(event, CheckpointWritten) and event.stall_seconds is not None:
            progress = replace(progress, stall_step=event.step, stall_seconds=event.stall_seconds)
    elif isinstance(event, TrainerFailed):
        progress = replace(progress, error=event.message, failure=event.kind)
    elif isinstance(event, SalvageWritten):
        progress = replace(progress, step=max(progress.step, event.step))
    elif isinstance(event, CollectiveFailed):
        own, received = snapshot_steps(event.snapshot_own_steps), snapshot_steps(event.snapshot_received_steps)
        progress = replace(
            progress, held=Held(event.stage, event.replica, event.step, own, received), error=event.error
        )
    checkpoint = getattr(event, "last_checkpoint", None)
    if checkpoint is not None:
        progress = replace(progress, last_checkpoint_step=checkpoint)
    return progress


def seconds_or_none(value: object) -> float | None:
    """A number of seconds from a trainer's file (any JSON value); its range is :func:`refusals.fit`'s to judge."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TrainerReport:
    """A trainer's observed state: status plus the latest facts from its progress file."""

    status: TrainerStatus
    pid: int
    step: int = 0
    loss: float | None = None
    samples_per_second: float | None = None
    last_checkpoint_step: int | None = None
    error: str = ""
    failure: FailureKind | None = None  # the trainer's own class of its failure ("input", "node": exit 2)
    finished: bool = False
    eval_step: int = 0
    eval_loss: float | None = None
    first_step_at: float | None = None
    first_step_seconds: float | None = None
    last_step_at: float | None = None
    held: Held | None = None  # its collective failed; it holds this step in memory
    stall_step: int = 0  # its newest checkpoint's step ...
    stall_seconds: float | None = None  # ... and how long it paused training (None: no checkpoint reported yet)
    held_skipped: str = ""  # why it did not take the state the previous generation held (empty: it did, or none)
    held_skipped_cause: str = ""  # its class, a HeldSkipCause value
    hand_off_failed: str = ""  # why its stop's hand-off was not used (empty: it was, or there was none)
