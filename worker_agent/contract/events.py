"""What a trainer reports: one JSON object per line of its progress file, one class per kind of fact.

A line is ``{"event": NAME, "rank", "generation", "pid", "time", ...the event's fields}``; the names on
disk are the short ones the trainers have always written (``step``, ``checkpoint``, ...), so old progress
files still parse. :func:`progress_line` writes a line and :func:`parse_progress_line` reads one back
into the same value; nothing else spells an event name or a field.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal, TypeVar

from worker_agent.contract.hostile import HostileFile, open_regular, parse_json_bounded

FailureKind = Literal[
    "input", "node", "port_taken", "checkpoint", "checkpoint_damaged", "abort", "lease_expired", "fenced"
]
E = TypeVar("E")


@dataclass(frozen=True)
class TrainerStarted:
    """Joined the rendezvous (its ``time`` is when the whole world was there)."""

    layout: str  # Layout.describe()
    process_started_at: float | None  # when the process (or the warm process it took over) began
    ready_at: float  # torch imported and the model built
    warm: bool  # a warm process took this assignment over


@dataclass(frozen=True)
class CheckpointLoaded:
    """Resumed from a checkpoint: ``step`` steps are already done."""

    step: int
    checkpoint: str


@dataclass(frozen=True)
class CheckpointSkipped:
    """A newer checkpoint was damaged (or another job's) and was passed over; ``message`` says which and why."""

    message: str


@dataclass(frozen=True)
class HeldStateSkipped:
    """The step the previous generation held in memory was not used (the committed checkpoint was): why, and
    its class (a :class:`morphing.transfer.HeldSkipCause` value; empty in lines written before there was one)."""

    reason: str
    cause: str = ""


@dataclass(frozen=True)
class HandOffFailed:
    """At an eviction's stop, the layers the leaving ranks handed over did not all arrive intact (``reason``):
    nothing was handed off, and every rank wrote the stopped ``step`` to the disk instead."""

    step: int
    reason: str


@dataclass(frozen=True)
class StepCompleted:
    """``step`` optimizer steps are done (on every rank: they all-reduce once per step)."""

    step: int
    loss: float  # the global-batch mean loss of that step
    step_seconds: float
    samples_per_second: float
    last_checkpoint: int | None  # the newest committed step this rank knows of (rank 0 commits)


@dataclass(frozen=True)
class EvaluationCompleted:
    """After ``step`` steps, the mean loss over the model's whole eval dataset (the same in every layout)."""

    step: int
    eval_loss: float
    eval_seconds: float


@dataclass(frozen=True)
class CheckpointWritten:
    """This rank has handed over its share of the checkpoint of ``step`` (after every checkpoint it takes).

    ``last_checkpoint`` is the newest step this rank knows is committed: ``step`` itself once the write
    is done, an older one while a background write is still going. ``stall_seconds`` is how long training
    paused for it: the copy to host memory at the step boundary (pinned memory on a GPU), plus the write
    when it is not in the background; None in lines written before it was reported.
    """

    step: int
    last_checkpoint: int | None
    stall_seconds: float | None = None


@dataclass(frozen=True)
class TrainingStopped:
    """Stopped when asked, at step boundary ``step``, after writing its checkpoint."""

    step: int
    last_checkpoint: int | None
    stop_at: float  # when the ranks agreed to stop
    checkpoint_seconds: float  # how long the final checkpoint took


@dataclass(frozen=True)
class TrainingFinished:
    """Reached the job's last step and wrote its checkpoint."""

    step: int
    last_checkpoint: int | None
    stop_at: float
    checkpoint_seconds: float


@dataclass(frozen=True)
class CollectiveFailed:
    """A collective failed or timed out (a peer is gone): the step in flight was abandoned, and this rank
    holds the parameters and optimizer state of ``step`` completed steps in memory, waiting for the
    controller's salvage order (:class:`worker_agent.contract.salvage.SalvageOrder`)."""

    generation: int
    stage: int
    replica: int
    step: int  # the last completed step: what it holds
    error: str
    snapshot_own_steps: list[int] = field(default_factory=list)  # peer snapshots: copies of its own stage it keeps
    snapshot_received_steps: list[int] = field(default_factory=list)  # ... and copies it received whole


@dataclass(frozen=True)
class SalvageWritten:
    """This rank wrote its stage's layers of the just-in-time checkpoint of ``step`` (``committed``: and,
    as the first writer, the manifest once every writer's part was there)."""

    step: int
    committed: bool
    seconds: float
    last_checkpoint: int | None  # ``step`` once committed


@dataclass(frozen=True)
class TrainerFailed:
    """About to exit non-zero; ``message`` is what the operator needs to know."""

    kind: FailureKind
    message: str


ProgressEvent = (
    TrainerStarted
    | CheckpointLoaded
    | CheckpointSkipped
    | HeldStateSkipped
    | HandOffFailed
    | StepCompleted
    | EvaluationCompleted
    | CheckpointWritten
    | TrainingStopped
    | TrainingFinished
    | CollectiveFailed
    | SalvageWritten
    | TrainerFailed
)

EVENT_NAMES: dict[type[ProgressEvent], str] = {
    TrainerStarted: "started",
    CheckpointLoaded: "resumed",
    CheckpointSkipped: "checkpoint_skipped",
    HeldStateSkipped: "held_skipped",
    HandOffFailed: "hand_off_failed",
    StepCompleted: "step",
    EvaluationCompleted: "eval",
    CheckpointWritten: "checkpoint",
    TrainingStopped: "stopped",
    TrainingFinished: "finished",
    CollectiveFailed: "collective_failed",
    SalvageWritten: "salvage_written",
    TrainerFailed: "error",
}
_EVENT_TYPES: dict[str, type[ProgressEvent]] = {name: kind for kind, name in EVENT_NAMES.items()}


class ProgressLineError(ValueError):
    """A line that is not a progress record (torn, from another version, or not JSON)."""


@dataclass(frozen=True)
class ProgressRecord:
    """One line: which trainer said it, when, and what."""

    event: ProgressEvent
    rank: int
    generation: int
    pid: int
    time: float


def progress_line(record: ProgressRecord) -> str:
    """The JSON line for ``record``, without the newline."""
    header = {
        "event": EVENT_NAMES[type(record.event)],
        "rank": record.rank,
        "generation": record.generation,
        "pid": record.pid,
        "time": record.time,
    }
    return json.dumps({**header, **asdict(record.event)})


def parse_progress_line(line: str | bytes) -> ProgressRecord:
    """The record a line holds; :class:`ProgressLineError` when it holds none. Unknown fields are ignored."""
    try:
        data = parse_json_bounded(line, "progress line", finite=False)
    except ValueError as exc:
        raise ProgressLineError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProgressLineError("not a JSON object")
    kind = _EVENT_TYPES.get(str(data.get("event")))
    if kind is None:
        raise ProgressLineError(f"unknown event {data.get('event')!r}")
    try:
        # A field added later has a default, so lines written before it still parse.
        required = [f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING]
        event = kind(**{f.name: data[f.name] for f in fields(kind) if f.name in data or f.name in required})
        return ProgressRecord(event, int(data["rank"]), int(data["generation"]), int(data["pid"]), float(data["time"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProgressLineError(f"{data.get('event')} line without {exc}") from None


def read_progress(path: Path) -> list[ProgressRecord]:
    """Every complete record in a progress file (a torn last line, or none at all, is not an error)."""
    reader = ProgressReader(path)
    out: list[ProgressRecord] = []
    while True:
        offset = reader.offset
        out += reader.poll()
        if reader.offset == offset:
            return out


class ProgressReader:
    """Reads a progress file as it grows: each :meth:`poll` returns the records completed since the last.

    The trainer runs the user's code, so the file is opened as hostile (:mod:`.hostile`: a FIFO put in its
    place reads as no records, never a blocked agent) and read at most ``MAX_POLL_BYTES`` per poll; a line
    longer than that is skipped."""

    MAX_POLL_BYTES = 16 << 20

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def poll(self) -> list[ProgressRecord]:
        try:
            with io.FileIO(open_regular(self.path), "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(self.MAX_POLL_BYTES) or b""
        except (OSError, HostileFile):
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        if not complete and len(chunk) == self.MAX_POLL_BYTES:
            complete = chunk  # one line longer than any record: skipped
        self.offset += len(complete)
        return self.parse_lines(complete.decode(errors="replace").splitlines())

    @staticmethod
    def parse_lines(lines: list[str]) -> list[ProgressRecord]:
        out = []
        for line in lines:
            try:
                out.append(parse_progress_line(line))
            except ProgressLineError:
                continue
        return out


def events_of(records: Iterable[ProgressRecord], kind: type[E]) -> list[E]:
    """The events of one kind, in order (``events_of(records, StepCompleted)``)."""
    return [r.event for r in records if isinstance(r.event, kind)]
