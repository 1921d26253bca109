"""Loss points for the dashboard's curves, kept in memory as the trainers report them.

``TrainingProgressed`` events carry a job's loss at most once a minute (the event log stays readable): too
few for the curve of a short run. The controller hears each job's newest loss with every heartbeat; this keeps
every ``(step, loss)`` it sees, bounded: past ``limit`` points a job keeps every other one, so a long run keeps
its whole shape at half the resolution. Kept in memory only: after a controller restart a curve starts from the
events in the store and goes on from here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from controller.core.records import JobRecord
from controller.shell.views import StateView

LIMIT = 1000


class LossCurves:
    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.points: dict[str, list[tuple[int, float]]] = {}

    def observe(self, jobs: Iterable[JobRecord]) -> None:
        """Take each job's newest loss; a generation that resumed from an earlier step redoes the steps past it."""
        seen = set()
        for job in jobs:
            seen.add(job.id)
            loss, step = job.training.loss, job.training.step
            if loss is None or not math.isfinite(loss):
                continue
            points = self.points.setdefault(job.id, [])
            if points and points[-1] == (step, loss):
                continue
            while points and points[-1][0] >= step:
                points.pop()
            points.append((step, loss))
            if len(points) > self.limit:
                points[:] = points[::2]
        for gone in set(self.points) - seen:  # jobs the store's retention removed
            del self.points[gone]

    def of(self, job: str) -> list[tuple[int, float]]:
        return list(self.points.get(job, ()))

    async def run(self, view: StateView) -> None:
        """Until cancelled: observe every job after every commit."""
        while True:
            changed = view.next_change()
            self.observe(view.jobs())
            await changed.wait()
