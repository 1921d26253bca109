"""Per job, TensorBoard event files under ``--tensorboard-dir/<job id>/``, from what the controller already holds.

Each commit, every job record is compared with the one last exported (:func:`points`, pure): a newer
training step writes ``train/loss``, ``train/samples_per_second`` and the layout that ran it
(``layout/stages``, ``layout/replicas``, ``layout/gpus``, ``layout/micro_batch_size``: a step function
whose jumps are the morphs), a newer evaluation ``eval/loss``, and a new generation a text marker under
``morphs`` with the reason the job record gives.
Points start from when the controller started exporting (a restarted controller adds a file, never
repeats a point); ``tensorboard --logdir DIR`` shows one run per job.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from controller.core.lifecycle import JOB_TERMINAL
from controller.core.model import JobRecord
from controller.observability.tfevents import EventFile

log = logging.getLogger("spotmorph.tensorboard")
MAX_OPEN_FILES = 64  # event files open at once (running jobs written to recently)
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


Shape = tuple[int, int, int, int]  # stages, replicas, GPUs, micro-batch size
LAYOUT_TAGS = ("layout/stages", "layout/replicas", "layout/gpus", "layout/micro_batch_size")


@dataclass(frozen=True)
class Seen:
    """What was last exported of one job."""

    step: int
    eval_step: int
    generation: int
    shape: Shape | None = None  # the layout of ``generation``


@dataclass(frozen=True)
class Point:
    tag: str
    step: int
    value: float | None = None  # a scalar, or
    text: str | None = None  # a text marker


def shape(job: JobRecord) -> Shape | None:
    layout = job.layout
    if layout is None:
        return None
    stages, replicas = layout.pipeline_stages, layout.data_parallel
    return stages, replicas, stages * replicas, layout.micro_batch_size


def seen(job: JobRecord) -> Seen:
    step = job.training.step if job.training.loss is not None else 0
    return Seen(step, job.evaluation.step or 0, job.generation, shape(job))


def later(before: Seen | None, now: Seen) -> Seen:
    """The newest of each: a generation that resumed from an earlier step rewrites no point already written."""
    if before is None:
        return now
    newer = now if now.generation >= before.generation else before
    return Seen(
        max(before.step, now.step), max(before.eval_step, now.eval_step), newer.generation, newer.shape or before.shape
    )


def _layout(step: int, values: Shape | None) -> list[Point]:
    return [] if values is None else [Point(tag, step, value) for tag, value in zip(LAYOUT_TAGS, values, strict=True)]


def points(before: Seen | None, job: JobRecord) -> list[Point]:
    """What changed in ``job`` since ``before`` (None: nothing exported of it yet), as TensorBoard points.

    The layout goes with every training step written, so TensorBoard draws a step function (flat between
    morphs, not a diagonal from one morph to the next): the layout of the generation that reported the step
    (the last step of the one before a morph keeps its own). A new generation also writes its layout at the
    step it starts from when that is past every step written (no tag's steps go backwards)."""
    out: list[Point] = []
    training, last = job.training, before.step if before else 0
    new_generation = job.layout is not None and job.generation > (before.generation if before else 0)
    at = job.resumed_at_step  # where a new generation starts: its checkpoint, or the memory held
    floor = last if before is not None and (last or before.shape) else -1  # a layout point may be there
    shapes: dict[int, Shape | None] = {at: shape(job)} if new_generation and at > floor else {}
    if training.loss is not None and training.step > last:
        out.append(Point("train/loss", training.step, training.loss))
        if training.samples_per_second is not None:
            out.append(Point("train/samples_per_second", training.step, training.samples_per_second))
        older = new_generation and 0 < training.generation < job.generation
        shapes[training.step] = (before.shape if older and before else None) or shape(job)
    for step in sorted(shapes):
        out += _layout(step, shapes[step])
    if (
        job.evaluation.loss is not None
        and job.evaluation.step
        and job.evaluation.step > (before.eval_step if before else 0)
    ):
        out.append(Point("eval/loss", job.evaluation.step, job.evaluation.loss))
    if new_generation:
        out.append(Point("morphs", at, text=f"generation {job.generation} from step {at}: {job.reason}"))
    return out


class Jobs(Protocol):
    def jobs(self) -> tuple[JobRecord, ...]: ...

    def next_change(self) -> asyncio.Event: ...


class TensorBoardExport:
    """Writes :func:`points` of every job after each commit; one :class:`EventFile` per job, opened lazily,
    closed once the job has ended, and at most ``max_open`` open at once (the least recently written is closed
    first; written again, it is opened again): the controller lives long and holds one descriptor per file."""

    def __init__(self, root: Path, view: Jobs, clock: Callable[[], float], max_open: int = MAX_OPEN_FILES) -> None:
        self.root, self.view, self.clock, self.max_open = root, view, clock, max_open
        self.seen: dict[str, Seen] = {job.id: seen(job) for job in view.jobs()}  # no history: from now on
        self.files: OrderedDict[str, EventFile] = OrderedDict()  # the most recently written last

    def export(self, jobs: Iterable[JobRecord]) -> int:
        """Write what changed; returns the number of points written."""
        written, now = 0, self.clock()
        for job in jobs:
            before = self.seen.get(job.id)
            new = points(before, job)
            self.seen[job.id] = later(before, seen(job))
            if new and SAFE_ID.match(job.id):
                file = self._file(job.id, now)
                for point in new:
                    if point.text is not None:
                        file.text(point.tag, point.text, point.step, now)
                    elif point.value is not None:
                        file.scalar(point.tag, point.value, point.step, now)
                file.flush()
                written += len(new)
            if job.state in JOB_TERMINAL and job.id in self.files:  # its last points are written
                self.files.pop(job.id).close()
        return written

    def _file(self, job_id: str, now: float) -> EventFile:
        file = self.files.pop(job_id, None)
        if file is None:
            while len(self.files) >= self.max_open:
                self.files.popitem(last=False)[1].close()
            file = EventFile(self.root / job_id, now)
        self.files[job_id] = file
        return file

    async def run(self) -> None:
        """Until cancelled: export after every commit. A failed write is logged and tried at the next one."""
        while True:
            changed = self.view.next_change()
            try:
                self.export(self.view.jobs())
            except OSError as exc:
                log.warning("tensorboard export to %s failed: %s", self.root, exc)
            await changed.wait()

    def close(self) -> None:
        for file in self.files.values():
            file.close()
        self.files.clear()
