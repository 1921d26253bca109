"""What ``spotmorph profile`` is doing, on stderr: the layer, the micro-batch size and the time left.

Calibrating a large model on a CPU takes many minutes (a 1024-wide, 8-layer Llama at sequence length 512
said nothing for 900 s), so a line comes as each layer starts at each size, at most one every few seconds.
The time left assumes a layer's timing grows with the micro-batch size: the work still to do, weighted by
size, at the pace of the work done. Lines go to stderr, flushed, so stdout stays the command's result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

PREFIX = "spotmorph profile: "


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: ``45 s``, ``3 min 10 s``, ``2 h 5 min``."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


class Progress:
    """Reports layer timings as they start; ``out=None`` reports nothing (a library caller's default)."""

    def __init__(
        self,
        layers: int,
        sizes: tuple[int, ...],
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        every: float = 2.0,
    ) -> None:
        self.layers, self.out, self.clock, self.every = layers, out, clock, every
        self.total = layers * sum(sizes)  # the timing work, in layer x samples
        self.done = 0
        self.unit = 0  # the weight of the timing under way (0: none)
        self.started: float | None = None
        self.last: float | None = None  # when the last line was written

    def measuring(self, index: int, name: str, size: int) -> None:
        """Layer ``index`` (from 0) starts its timing at micro-batch size ``size``."""
        now = self.clock()
        self._finish_unit()
        if self.started is None:
            self.started = now
        self.unit = size
        if self.last is not None and now - self.last < self.every:
            return
        self._say(f"layer {index + 1} of {self.layers} ({name}), micro-batch {size}: {self._left(now)}", now)

    def phase(self, text: str) -> None:
        """A step other than a layer's timing (memory, the network); always said."""
        self._finish_unit()
        self._say(text, self.clock())

    def _finish_unit(self) -> None:
        self.done += self.unit
        self.unit = 0

    def _left(self, now: float) -> str:
        if self.started is None or self.done == 0:
            return "estimating the time left"
        rate = (now - self.started) / self.done
        return f"about {duration(rate * (self.total - self.done))} left"

    def _say(self, text: str, now: float) -> None:
        self.last = now
        if self.out is not None:
            print(PREFIX + text, file=self.out, flush=True)
