"""A trainer's side of the agent's control: its progress file, stop requests and checkpoint requests.

The lease (:meth:`worker_agent.contract.ControlDir.lease`) is checked at every step boundary too, and agreed on
in the same all-reduce: a rank whose agent stopped renewing it stops the whole generation.

Stop and checkpoint requests arrive on one rank at a time (a signal, a file the agent writes); the trainer
agrees on them in-band, in the per-step all-reduce, so every rank acts at the same step boundary.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import FrameType

from worker_agent.contract import ControlDir, ProgressEvent, ProgressRecord, progress_line
from worker_agent.runtime.link.training_log import TrainingLog


class ProgressLog:
    """JSON lines for the agent (:mod:`worker_agent.contract.events`): one per event, flushed at once; and, once
    the generation is set up, rank 0's :class:`TrainingLog` lines on stdout (the trainer's log)."""

    def __init__(self, path: Path | None, rank: int, generation: int) -> None:
        self.rank = rank
        self.generation = generation
        self._fh = open(path, "a", buffering=1) if path is not None else None  # noqa: SIM115
        self.lines: TrainingLog | None = None

    def emit(self, event: ProgressEvent) -> None:
        at = time.time()
        said = self.lines.line(event, at) if self.lines is not None else None
        if said is not None:
            print(said, flush=True)
        if self._fh is None:
            return
        record = ProgressRecord(event, self.rank, self.generation, os.getpid(), at)
        self._fh.write(progress_line(record) + "\n")
        self._fh.flush()


class StopRequest:
    """Set by SIGTERM / SIGINT or by the control dir's stop file; agreed on in-band by all ranks."""

    def __init__(self, control: ControlDir | None) -> None:
        self.control = control
        self.signalled = False
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True

    def requested(self) -> bool:
        return self.signalled or (self.control is not None and self.control.stop_requested())

    def leaving(self) -> bool:
        """This process or its node is going: what it holds in memory would not outlive the stop."""
        return self.signalled or (self.control is not None and self.control.leaving())


class LeaseWatch:
    """The agent's lease on this node's trainers; without a control dir or a lease file there is none."""

    def __init__(self, control: ControlDir | None) -> None:
        self.control = control
        self._lapsed_for = 0.0

    def lapsed(self) -> bool:
        lease = self.control.lease() if self.control is not None else None
        if lease is None:
            return False
        self._lapsed_for = lease.lapsed_for(time.monotonic())
        return self._lapsed_for > 0

    def explain(self, step: int) -> str:
        if self._lapsed_for > 0:
            why = f"this node's lease ran out {self._lapsed_for:.1f} s ago"
        else:
            why = "the lease of another rank's node ran out"
        return (
            f"{why} (its agent no longer reaches the controller, or is frozen): the controller will give this "
            f"generation up, so every rank stops at step {step} without a checkpoint"
        )


class CheckpointRequests:
    """Checkpoint requests, agreed on in-band: rank 0's request counter rides the per-step all-reduce.

    Only rank 0 contributes its counter (the others add 0), so every rank sees the same value at the same
    step boundary even though each node's agent publishes it at its own moment. The first value seen is
    the baseline (a request older than this generation is already covered by the checkpoint it resumed
    from); any later change is one request.
    """

    def __init__(self, control: ControlDir | None, rank: int) -> None:
        self.control = control if rank == 0 else None
        self.acted_on: int | None = None

    def contribution(self) -> float:
        return float(self.control.checkpoint_request()) if self.control is not None else 0.0

    def requested(self, agreed: float) -> bool:
        """Whether the counter all ranks now share is a new request (remembering it as acted on)."""
        counter = int(agreed)
        new = self.acted_on is not None and counter != self.acted_on
        self.acted_on = counter
        return new
