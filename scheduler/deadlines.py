"""When a job needs on-demand GPUs, and how many: the deadline rules, spotmorph's and the baselines'.

- ``FORECAST`` (spotmorph): the fewest on-demand GPUs with which the job's liveput (its expected samples/s
  on its spot share, over the forecast's evictions and refills, plus those on-demand GPUs) finishes its work
  before the deadline with a margin; none while spot alone does. On-demand is given back when spot alone
  does again, by a wider margin (hysteresis). Whatever the forecast says, from the last safe moment on
  (the deadline minus the time the job needs on all the on-demand GPUs it may have, a morph, a VM's start
  and a safety margin) the job runs on those on-demand GPUs to the end: the deadline does not depend on the
  forecast being right.
- ``UNIFORM_PROGRESS`` (Can't Be Late, NSDI'24): on spot while the work done is ahead of the straight line
  from submission to the deadline, on all its on-demand GPUs while behind it (and past the last safe moment).
- ``NEVER`` (spot only) and ``ALWAYS`` (on-demand only: every job on its max GPUs on demand).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from scheduler.forecast import Rates, liveput
from scheduler.jobs import JobView
from scheduler.pools import PoolKind


class OnDemandRule(StrEnum):
    FORECAST = "forecast"
    UNIFORM_PROGRESS = "uniform-progress"
    NEVER = "never"
    ALWAYS = "always"


class CapacityCause(StrEnum):
    """Why a job holds (or is given, or gives back) on-demand capacity: what status shows."""

    DEADLINE_AT_RISK = "deadline_at_risk"  # the forecast on spot alone misses the deadline
    LAST_SAFE_MOMENT = "last_safe_moment"  # only all its on-demand GPUs from now on still meet it
    BEHIND_UNIFORM_PROGRESS = "behind_uniform_progress"  # the baseline's rule
    ON_DEMAND_ONLY = "on_demand_only"  # the baseline that never uses spot
    SPOT_RETURNED = "spot_returned"  # given back: spot alone meets the deadline again
    JOB_DONE = "job_done"  # given back: the job finished or left


@dataclass(frozen=True)
class OnDemandNeed:
    job: str
    gpus: int
    cause: CapacityCause | None  # None: it needs none and held none


@dataclass(frozen=True)
class DeadlineConfig:
    rule: OnDemandRule = OnDemandRule.FORECAST
    safety_seconds: float = 900.0
    margin: float = 0.05  # the forecast must beat the work left by this fraction (tuned: docs/benchmarks.md)
    release_margin: float = 0.25  # ... and by this to give on-demand GPUs back
    on_demand_start_seconds: float = 120.0  # a requested VM's time to arrive
    ahead_fraction: float = 0.02  # uniform progress gives on-demand back this far ahead of its line
    outlook: bool = True  # the forecast rule projects the whole cluster's spot share (scheduler.outlook)
    outlook_step_seconds: float = 600.0
    defer: bool = True  # the outlook: more on-demand GPUs only once the same arriving a step later would miss

    def __post_init__(self) -> None:
        if min(self.safety_seconds, self.margin, self.on_demand_start_seconds, self.ahead_fraction) < 0:
            raise ValueError("deadline margins and start seconds must be >= 0")
        if self.outlook_step_seconds <= 0:
            raise ValueError("outlook_step_seconds must be > 0")
        if self.release_margin < self.margin:
            raise ValueError("release_margin must be >= margin (or on-demand GPUs come and go every call)")


def on_demand_need(
    job: JobView, spot_gpus: int, gpus_per_node: int, spot: Rates, now: float, config: DeadlineConfig
) -> OnDemandNeed:
    """The on-demand GPUs ``job`` should hold at ``now``, given the ``spot_gpus`` it holds on spot."""
    held = job.held_gpus(PoolKind.ON_DEMAND)
    release = CapacityCause.JOB_DONE if held else None
    if job.remaining_samples <= 0 or now < job.submitted_at:
        return OnDemandNeed(job.name, 0, release)
    if config.rule is OnDemandRule.ALWAYS:
        return OnDemandNeed(job.name, job.max_gpus, CapacityCause.ON_DEMAND_ONLY)
    limit = job.on_demand_limit
    if config.rule is OnDemandRule.NEVER or job.deadline is None or limit == 0:
        return OnDemandNeed(job.name, 0, release)
    left = job.deadline - now
    full = job.rate(limit)
    if full > 0 and left <= job.remaining_samples / full + _switch_seconds(job, config):
        return OnDemandNeed(job.name, limit, CapacityCause.LAST_SAFE_MOMENT)
    if config.rule is OnDemandRule.UNIFORM_PROGRESS:
        return _uniform_progress(job, held, limit, now, config)
    nodes = -(-spot_gpus // gpus_per_node)

    def meets(gpus: int) -> bool:
        wanted = 1.0 + (config.release_margin if gpus < held else config.margin)
        start = config.on_demand_start_seconds if gpus > held else 0.0
        rate = liveput(job.rate, nodes, gpus_per_node, gpus, spot, left, job.morph_cost_seconds)
        return rate * max(0.0, left - start) >= job.remaining_samples * wanted

    low, high = 0, limit  # the fewest GPUs that meet it (meets() only gets easier with more): a binary search
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if meets(middle) else (middle + 1, high)
    low = max(low, waiting_level(job))
    if low == 0:
        return OnDemandNeed(job.name, 0, CapacityCause.SPOT_RETURNED if held else None)
    return OnDemandNeed(job.name, low, CapacityCause.DEADLINE_AT_RISK)


def waiting_level(job: JobView) -> int:
    """The level a job waiting for on-demand GPUs it asked for keeps (0: it waits for none): the GPUs it holds and
    those on their way. Spot that seems to return meanwhile (a VM that registered before the provider named its
    pool looks like spot) does not take it back: the level is judged again once its capacity arrived."""
    if job.on_demand_pending <= 0:
        return 0
    return job.held_gpus(PoolKind.ON_DEMAND) + job.on_demand_pending


def _switch_seconds(job: JobView, config: DeadlineConfig) -> float:
    return job.morph_cost_seconds + config.on_demand_start_seconds + config.safety_seconds


def _uniform_progress(job: JobView, held: int, limit: int, now: float, config: DeadlineConfig) -> OnDemandNeed:
    assert job.deadline is not None
    total = job.total_samples or job.remaining_samples
    span = job.deadline - job.submitted_at
    line = min(1.0, (now - job.submitted_at) / span) if span > 0 else 1.0
    done = 1.0 - job.remaining_samples / total if total > 0 else 1.0
    if done < line or (held and done < line + config.ahead_fraction):
        return OnDemandNeed(job.name, limit, CapacityCause.BEHIND_UNIFORM_PROGRESS)
    return OnDemandNeed(job.name, 0, CapacityCause.SPOT_RETURNED if held else None)
