"""How long spot capacity lasts, estimated from what was seen: each pool's eviction and return rates.

Each of a pool's node slots (up to the most nodes it has held at once) is a two-state chain: a live node is
evicted at rate ``eviction`` (per node-second), an empty slot is filled at rate ``arrival`` (per empty-slot
second). The rates are maximum-likelihood estimates (events over exposure) from sufficient statistics that
:func:`observe` accumulates as a value, so the history persists as four numbers per pool (``to_dict``), and
a prior (pseudo-counts, e.g. from a trace: :func:`seed_from_counts`) keeps a young history from claiming
certainty. ``liveput`` (Parcae, NSDI'24) is what the scheduler plans with: the samples/s a job expects over a
horizon from GPUs that may be evicted (each loss also pausing it for a morph), not from the GPUs present.
An on-demand pool is never evicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from scheduler.pools import PoolKind

HOUR = 3600.0


@dataclass(frozen=True)
class PoolStats:
    """Sufficient statistics of one pool's history (``live`` and ``at`` are the last observation)."""

    kind: PoolKind
    evictions: float = 0.0
    arrivals: float = 0.0
    up_seconds: float = 0.0  # node-seconds nodes were live
    empty_seconds: float = 0.0  # slot-seconds below the peak
    peak: int = 0
    live: int = 0
    at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.value if isinstance(v, PoolKind) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolStats:
        return cls(**{**data, "kind": PoolKind(data["kind"])})


def observe(stats: PoolStats, now: float, live: int, evicted: int = 0, arrived: int | None = None) -> PoolStats:
    """``stats`` advanced to ``now``, when ``live`` nodes are present; ``evicted`` of those gone since the last
    observation were evictions (a node given back is not one); ``arrived`` defaults to the net growth."""
    if now < (stats.at if stats.at is not None else now) or live < 0 or evicted < 0:
        raise ValueError(f"observe: time went back ({stats.at} -> {now}) or a negative count")
    elapsed = 0.0 if stats.at is None else now - stats.at
    peak = max(stats.peak, live)
    came = max(0, live - stats.live) if arrived is None else arrived
    return replace(
        stats,
        evictions=stats.evictions + evicted,
        arrivals=stats.arrivals + (came if stats.at is not None else 0),
        up_seconds=stats.up_seconds + stats.live * elapsed,
        empty_seconds=stats.empty_seconds + max(0, stats.peak - stats.live) * elapsed,
        peak=peak,
        live=live,
        at=now,
    )


def seed_from_counts(kind: PoolKind, points: Sequence[tuple[float, int]], weight: float = 1.0) -> PoolStats:
    """A prior from a trace's ``(seconds, nodes from then on)`` points, its counts scaled by ``weight`` (< 1: a
    softer prior). Every drop counts as evictions, every rise as arrivals."""
    stats = PoolStats(kind)
    for seconds, count in points:
        stats = observe(stats, seconds, count, evicted=max(0, stats.live - count))
    return replace(
        stats,
        evictions=stats.evictions * weight,
        arrivals=stats.arrivals * weight,
        up_seconds=stats.up_seconds * weight,
        empty_seconds=stats.empty_seconds * weight,
        at=None,
        live=0,
    )


@dataclass(frozen=True)
class Prior:
    """Pseudo-observations added to every pool's history: ``evictions`` over ``up_hours`` node-hours, etc."""

    evictions: float = 1.0
    up_hours: float = 10.0
    arrivals: float = 1.0
    empty_hours: float = 1.0


@dataclass(frozen=True)
class Rates:
    """Per second: a live node's eviction rate and an empty slot's refill rate."""

    eviction: float
    arrival: float

    def alive(self, seconds: float) -> float:
        """Probability that a slot live now is live ``seconds`` later (refills included)."""
        total = self.eviction + self.arrival
        if total <= 0:
            return 1.0
        steady = self.arrival / total
        return steady + (1.0 - steady) * math.exp(-total * seconds)


def rates(stats: PoolStats, prior: Prior = Prior(), seed: PoolStats | None = None) -> Rates:
    """The pool's estimated rates; on-demand capacity stays (no evictions)."""
    if stats.kind is PoolKind.ON_DEMAND:
        return Rates(0.0, 0.0)
    extra = seed or PoolStats(stats.kind)
    up = stats.up_seconds + extra.up_seconds + prior.up_hours * HOUR
    empty = stats.empty_seconds + extra.empty_seconds + prior.empty_hours * HOUR
    return Rates(
        (stats.evictions + extra.evictions + prior.evictions) / up,
        (stats.arrivals + extra.arrivals + prior.arrivals) / empty,
    )


def liveput(
    rate: Callable[[int], float],
    spot_nodes: int,
    gpus_per_node: int,
    fixed_gpus: int,
    pool: Rates,
    horizon_seconds: float,
    morph_cost_seconds: float,
    points: int = 8,
) -> float:
    """Expected samples/s over ``horizon_seconds`` of a job on ``fixed_gpus`` that stay plus ``spot_nodes``
    spot nodes, each live at time t with probability ``pool.alive(t)``; each expected eviction of one of them
    also costs ``morph_cost_seconds`` of no training."""
    if horizon_seconds <= 0:
        return rate(fixed_gpus + spot_nodes * gpus_per_node)
    total = 0.0
    for i in range(points):
        p = pool.alive((i + 0.5) * horizon_seconds / points)
        total += sum(
            math.comb(spot_nodes, up) * p**up * (1 - p) ** (spot_nodes - up) * rate(fixed_gpus + up * gpus_per_node)
            for up in range(spot_nodes + 1)
        )
    mean = total / points
    losses = pool.eviction * spot_nodes * horizon_seconds
    pause = min(1.0, losses * morph_cost_seconds / horizon_seconds)
    return mean * (1.0 - pause)
