"""Start-up phases bounded in time: a phase that blocks past its limit ends the trainer, naming the phase.

A trainer's start-up waits on things other hosts control: the checkpoint dir's fence lock on the share (a
frozen trainer of an older generation, or anyone, can hold it; ``lockf`` waits for as long as it is held),
and the rendezvous (bounded by its own deadline). A blocked system call cannot be interrupted from Python,
so a watchdog thread does it: when the phase is not done in time it reports ``TrainerFailed`` (kind
``abort``: another attempt may find the share free) naming the stuck phase, and ends the process.
Otherwise the generation would sit RUNNING forever with no event and no timeout.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from enum import Enum

from worker_agent.contract import ExitCode, TrainerFailed
from worker_agent.runtime.link.control import ProgressLog


class Phase(Enum):
    """A start-up phase that waits on another host; its value says what it waits for."""

    FENCE = "raising the checkpoint dir's fence (waiting for its lock on the share)"


def _wait(done: threading.Event, limit: float) -> bool:
    return done.wait(limit)


def _exit(code: int) -> None:
    os._exit(code)


class StartupWatch:
    """``with watch.phase(Phase.FENCE, limit): ...`` ends the process when the block takes longer than ``limit``.

    ``wait`` and ``exit`` are injected by tests (a watchdog whose time is up at once; an exit that records)."""

    def __init__(
        self,
        progress: ProgressLog,
        rank: int,
        wait: Callable[[threading.Event, float], bool] = _wait,
        exit: Callable[[int], None] = _exit,
    ) -> None:
        self.progress = progress
        self.rank = rank
        self._wait = wait
        self._exit = exit

    @contextlib.contextmanager
    def phase(self, phase: Phase, limit: float) -> Iterator[None]:
        done = threading.Event()

        def watch() -> None:
            if self._wait(done, limit):
                return
            message = (
                f"start-up phase {phase.name.lower()} ({phase.value}) did not finish in {limit:.0f} s; the trainer "
                "stops so that the controller can try again (check the share and who holds it)"
            )
            print(f"spotmorph trainer (rank {self.rank}): aborting: {message}", file=sys.stderr, flush=True)
            self.progress.emit(TrainerFailed(kind="abort", message=message))
            self._exit(ExitCode.ABORTED)

        watchdog = threading.Thread(target=watch, name=f"startup-{phase.name.lower()}", daemon=True)
        watchdog.start()
        try:
            yield
        finally:
            done.set()
            watchdog.join()
