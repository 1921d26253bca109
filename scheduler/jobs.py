"""What the scheduler is told about jobs and nodes: frozen values, observed by the caller, never fetched.

The controller's core (from its records) and ``spotmorph simulate --jobs`` (from its replay) build these; every
decision in the package is a pure function of them and an injected ``now`` (seconds on the caller's clock).
A job's speed is its throughput curve: samples/s on 0..max_gpus GPUs, which the planner gives
(:func:`throughput_curve`), so the scheduler compares jobs by what GPUs are worth to each, not by counts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import StrEnum

from morphing.plan_result import throughput
from morphing.planner import Planner
from scheduler.pools import PoolKind


class OnDemand(StrEnum):
    """Whether a job may be given on-demand capacity when its deadline is at risk on spot alone."""

    ALLOWED = "allowed"
    NEVER = "never"


@dataclass(frozen=True)
class Node:
    """A VM present now. An on-demand node was requested for one job (``owner``) and serves only it."""

    name: str
    pool: PoolKind
    gpus: int
    owner: str | None = None


@dataclass(frozen=True)
class Grant:
    """``gpus`` GPUs of ``node`` go to ``job`` (the allocation's output, and a job's holding on input)."""

    job: str
    node: str
    pool: PoolKind
    gpus: int


@dataclass(frozen=True)
class JobView:
    """One job as the scheduler sees it.

    ``rates[n]`` is the samples/s on ``n`` GPUs (``rates[0] == 0``; its length - 1 is the job's max GPUs);
    ``deadline`` and ``submitted_at`` are on the caller's clock (seconds); ``waited_seconds`` is how long the
    job has been runnable with no GPUs at all since it last had some (what aging counts), ``running_seconds`` how
    long it has had some since it last had none (a job stopped for priority ran at least ``min_run_seconds``, so
    a job served because it starved is not stopped at once); ``held`` is what it
    holds now (on nodes that may since have gone: those count for nothing); ``eligible_nodes`` the nodes it may
    be given (None: any).
    """

    name: str
    rates: tuple[float, ...]
    remaining_samples: float
    total_samples: float | None = None  # the whole job's (None: as remaining); uniform progress draws its line
    priority: int = 0
    submitted_at: float = 0.0
    deadline: float | None = None
    on_demand: OnDemand = OnDemand.ALLOWED
    on_demand_cap_gpus: int | None = None
    waited_seconds: float = 0.0
    running_seconds: float = 0.0  # how long it has had GPUs, since it last had none
    morph_cost_seconds: float = 15.0
    held: tuple[Grant, ...] = ()
    on_demand_pending: int = 0  # on-demand GPUs requested for it that have not arrived yet
    # The nodes it may be given GPUs of (None: any). The caller says which: its exclusions, nodes at risk of
    # eviction, the device kind it needs, on-demand nodes of other jobs; the scheduler never grants any other.
    eligible_nodes: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if not self.rates or self.rates[0] != 0.0 or any(b < a for a, b in itertools.pairwise(self.rates)):
            raise ValueError(
                f"job {self.name}: rates must start at 0.0 (no GPUs) and never fall as GPUs are added "
                "(the planner leaves GPUs idle rather: use throughput_curve)"
            )
        if self.remaining_samples < 0 or self.waited_seconds < 0 or self.morph_cost_seconds < 0:
            raise ValueError(f"job {self.name}: remaining_samples, waited_seconds and morph cost must be >= 0")

    @property
    def max_gpus(self) -> int:
        return len(self.rates) - 1

    @property
    def min_gpus(self) -> int | None:
        """The fewest GPUs it runs on at all (``None``: it fits no count up to its max)."""
        return next((n for n, rate in enumerate(self.rates) if rate > 0), None)

    @property
    def on_demand_limit(self) -> int:
        """The most on-demand GPUs it may be given."""
        if self.on_demand is OnDemand.NEVER:
            return 0
        cap = self.max_gpus if self.on_demand_cap_gpus is None else self.on_demand_cap_gpus
        return max(0, min(cap, self.max_gpus))

    def rate(self, gpus: int) -> float:
        """Samples/s on ``gpus`` GPUs (more than its max: its max's)."""
        return self.rates[min(max(gpus, 0), self.max_gpus)]

    def may_use(self, node: str) -> bool:
        return self.eligible_nodes is None or node in self.eligible_nodes

    def held_gpus(self, pool: PoolKind, present: frozenset[str] | None = None) -> int:
        return sum(g.gpus for g in self.held if g.pool is pool and (present is None or g.node in present))


def throughput_curve(planner: Planner, max_gpus: int, gpus_per_node: int = 1) -> tuple[float, ...]:
    """``rates`` for :class:`JobView`: the planner's best samples/s on 0..max_gpus GPUs (one what-if sweep)."""
    if max_gpus <= 0:
        return (0.0,)
    return (0.0, *(throughput(result) for result in planner.what_if(max_gpus, gpus_per_node)))
