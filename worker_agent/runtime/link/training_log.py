"""The lines rank 0's trainer prints about its training: one source for ``spotmorph train``'s output and the
trainers' log under the controller (``spotmorph logs JOB``).

Every ``log_interval`` steps (a job field), each generation's first step and its last: the step, the loss, the
samples per second, the layout and the time left at this generation's pace; and every evaluation, checkpoint
and end. Pure: the events and their times come in, the lines come out (:class:`ProgressLog` prints them).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker_agent.contract import (
    CheckpointWritten,
    EvaluationCompleted,
    ProgressEvent,
    StepCompleted,
    TrainingFinished,
    TrainingStopped,
)

# How the lines word the facts (for people; the progress file has its own names).
ENDINGS: dict[type, str] = {CheckpointWritten: "checkpoint", TrainingStopped: "stopped", TrainingFinished: "finished"}


@dataclass
class TrainingLog:
    """What to print of one generation's progress events (``layout``: its shape in words, e.g. ``1x2 (P x D),
    m=4``; ``steps``: the job's last step, for the time left)."""

    interval: int
    steps: int
    layout: str
    first: tuple[float, int] | None = None  # (time, step) of the first step this generation completed

    def line(self, event: ProgressEvent, at: float) -> str | None:
        """The line ``event`` (reported at ``at``, seconds) prints, or None."""
        if isinstance(event, StepCompleted):
            return self._step(event, at)
        if isinstance(event, EvaluationCompleted):
            return f"eval at step {event.step}  loss {event.eval_loss:.4f}  ({event.eval_seconds:.1f} s)"
        if isinstance(event, CheckpointWritten | TrainingStopped | TrainingFinished):
            return f"{ENDINGS[type(event)]} at step {event.step} (last checkpoint: step {event.last_checkpoint})"
        return None

    def _step(self, event: StepCompleted, at: float) -> str | None:
        first = self.first is None
        self.first = self.first or (at, event.step)
        due = self.interval > 0 and event.step % self.interval == 0
        if not (first or due or event.step >= self.steps):
            return None
        return (
            f"step {event.step:6d}  loss {event.loss:.4f}  {event.samples_per_second:8.1f} samples/s"
            f"  layout {self.layout}" + self._left(at, event.step)
        )

    def _left(self, now: float, step: int) -> str:
        """``  12m05s left`` at the pace of this generation's steps so far (nothing before two steps)."""
        if self.first is None or step <= self.first[1] or not self.steps or step >= self.steps:
            return ""
        seconds = (self.steps - step) * (now - self.first[0]) / (step - self.first[1])
        minutes, secs = divmod(round(seconds), 60)
        hours, minutes = divmod(minutes, 60)
        return f"  {hours}h{minutes:02d}m left" if hours else f"  {minutes}m{secs:02d}s left"
