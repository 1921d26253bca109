"""What ends an agent's wait for its trainers early: a trainer's byte at the wake FIFO
(:mod:`worker_agent.contract.wake`: it stopped and holds its state, or its collective failed) and SIGCHLD (a
trainer exited: every trainer is the agent's child, started, or adopted as a subreaper). Between them the agent
still looks every ``local_poll_seconds``."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from worker_agent.contract.wake import WakeFifo


class TrainerWakeup:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.poked = asyncio.Event()  # set by a poke or SIGCHLD; cleared before each look at the trainers
        self._fifo: WakeFifo | None = None

    def listen(self) -> None:
        """Open the FIFO afresh and listen on it and for SIGCHLD (inside the agent's running loop)."""
        fifo = self._fifo = WakeFifo(self.path)

        def poked() -> None:
            fifo.drain()
            self.poked.set()

        loop = asyncio.get_running_loop()
        loop.add_reader(fifo.fd, poked)
        loop.add_signal_handler(signal.SIGCHLD, self.poked.set)

    def close(self) -> None:
        if self._fifo is not None:
            loop = asyncio.get_running_loop()
            loop.remove_signal_handler(signal.SIGCHLD)
            loop.remove_reader(self._fifo.fd)
            self._fifo.close()
            self._fifo = None

    async def wait(self, wake: asyncio.Event, timeout: float) -> bool:
        """Up to ``timeout`` for ``wake`` (True: the agent beats now) or a poke (False: it looks at the trainers)."""
        waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(self.poked.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        return wake.is_set()
