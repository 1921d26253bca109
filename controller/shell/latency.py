"""A tiny fixed-bucket latency histogram (server-side heartbeat handler time).

Buckets are log-spaced, 20 per decade from 10 µs to 100 s (each about 12% wider than the one before),
so a quantile read from it is within about 12% of the true value. Counts are cumulative over the
process's life: a reader takes two snapshots and subtracts them to get a window.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

PER_DECADE = 20
BOUNDS: tuple[float, ...] = tuple(1e-5 * 10 ** (i / PER_DECADE) for i in range(7 * PER_DECADE + 1))


class Histogram:
    """``record(seconds)`` is O(log buckets) and allocation-free; the last bucket also takes overflows."""

    def __init__(self) -> None:
        self.counts = [0] * len(BOUNDS)
        self.count = 0
        self.sum = 0.0

    def record(self, seconds: float) -> None:
        index = min(bisect.bisect_left(BOUNDS, seconds), len(BOUNDS) - 1)
        self.counts[index] += 1
        self.count += 1
        self.sum += seconds


def quantile(counts: Sequence[int], q: float, bounds: Sequence[float] = BOUNDS) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` (0 < q <= 1) of ``counts``; None when empty."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    running = 0
    for bound, n in zip(bounds, counts, strict=True):
        running += n
        if running >= rank:
            return bound
    return bounds[-1]
