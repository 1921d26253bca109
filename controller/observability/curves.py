"""Loss and throughput points for the dashboard's curves, kept in memory as the trainers report them.

``TrainingProgressed`` events carry a job's loss and samples/s at most once a minute (the event log stays
readable): too few for the curve of a short run. The controller hears each job's newest loss and rate with
every heartbeat; this keeps every ``(step, value)`` it sees, bounded: past ``limit`` points a job keeps every
other one, so a long run keeps its whole shape at half the resolution. Kept in memory only: after a controller
restart a curve starts from the events in the store and goes on from here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from controller.core.records import JobRecord
from controller.shell.views import StateView

LIMIT = 1000


def _keep(points: list[tuple[int, float]], step: int, value: float | None, limit: int) -> None:
    """Add ``(step, value)``; a generation that resumed from an earlier step redoes the steps past it."""
    if value is None or not math.isfinite(value) or (points and points[-1] == (step, value)):
        return
    while points and points[-1][0] >= step:
        points.pop()
    points.append((step, value))
    if len(points) > limit:
        points[:] = points[::2]


class LossCurves:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.points: dict[str, list[tuple[int, float]]] = {}  # losses
        self.rates: dict[str, list[tuple[int, float]]] = {}  # samples/s

    def observe(self, jobs: Iterable[JobRecord]) -> None:
        """Take each job's newest loss and rate (a job with no finite loss yet starts no curve)."""
        seen = set()
        for job in jobs:
            seen.add(job.id)
            training = job.training
            if training.loss is None or not math.isfinite(training.loss):
                continue
            _keep(self.points.setdefault(job.id, []), training.step, training.loss, self.limit)
            _keep(self.rates.setdefault(job.id, []), training.step, training.samples_per_second, self.limit)
        for kept in (self.points, self.rates):
            for gone in set(kept) - seen:  # jobs the store's retention removed
                del kept[gone]

    def of(self, job: str) -> list[tuple[int, float]]:
        return list(self.points.get(job, ()))

    def rates_of(self, job: str) -> list[tuple[int, float]]:
        return list(self.rates.get(job, ()))

    async def run(self, view: StateView) -> None:
        """Until cancelled: observe every job after every commit."""
        while True:
            changed = view.next_change()
            self.observe(view.jobs())
            await changed.wait()
