"""Every job's on-demand need from one outlook of the whole cluster (spotmorph's ``FORECAST`` rule).

``deadlines.on_demand_need`` judges one job on the spot share it has *now*: a job that arrives while the others
hold every spot GPU expects nothing from spot and asks for all its on-demand GPUs at once, although the others
finish within the hour and leave it the pool. Here the spot pool is projected forward instead (a fluid replay
in ``step_seconds`` steps): the spot GPUs present now (the pool taken at its equilibrium: as many nodes come as
go) go at each step to the jobs in priority order (then earliest deadline), each up to its max GPUs less its
on-demand GPUs; a job that finishes leaves its share to the others, and a job submitted later takes its share
from its submission on. Each expected eviction (the forecast's rate) pauses its job for a morph. A job's need
is then the fewest on-demand GPUs (the others keeping theirs) with which its projected work by the deadline
beats its work left by ``margin``, counted from when they would arrive. Fewer, longer holds: a job keeps the
on-demand GPUs it holds until spot alone beats its work left by ``release_margin`` (then all go back at once),
so a node coming and going does not make on-demand GPUs come and go. The last safe moment stays
``on_demand_need``'s (all its on-demand GPUs to the end), so no deadline depends on the outlook being right.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler.deadlines import CapacityCause, DeadlineConfig, OnDemandNeed, OnDemandRule, on_demand_need
from scheduler.forecast import Rates
from scheduler.jobs import JobView
from scheduler.pools import PoolKind


@dataclass(frozen=True)
class Outlook:
    """What the projection starts from: the spot GPUs present now, the pool's rates (evictions pause jobs), ``now``."""

    spot_gpus: int
    gpus_per_node: int
    spot: Rates
    now: float
    step_seconds: float = 600.0
    room: tuple[tuple[str, int], ...] = ()  # (job, spot GPUs of the nodes it may use): its share never exceeds them

    def room_of(self, job: str) -> float:
        return float(next((gpus for name, gpus in self.room if name == job), self.spot_gpus))


def needs(
    jobs: Sequence[JobView],
    alone: Mapping[str, int],
    outlook: Outlook,
    config: DeadlineConfig,
    owned: Mapping[str, int] | None = None,
) -> list[OnDemandNeed]:
    """Each job's on-demand need; ``alone`` is each job's spot share now (for the rules other than the forecast's
    and for the last safe moment); ``owned[job]``: the on-demand GPUs of the nodes present that are its, placed on
    or not (a job queued on its arrived on-demand nodes keeps them as one running on them would)."""
    base = [
        on_demand_need(j, alone.get(j.name, 0), outlook.gpus_per_node, outlook.spot, outlook.now, config) for j in jobs
    ]
    if config.rule is not OnDemandRule.FORECAST:
        return base
    mine = owned or {}
    fixed = {j.name: max(j.held_gpus(PoolKind.ON_DEMAND), mine.get(j.name, 0)) + j.on_demand_pending for j in jobs}
    out = []
    for job, need in zip(jobs, base, strict=True):
        if need.cause not in (CapacityCause.DEADLINE_AT_RISK, CapacityCause.SPOT_RETURNED, None) or not _judged(
            job, outlook.now
        ):
            out.append(need)
            continue
        out.append(_need(job, jobs, fixed, outlook, config))
    return out


def _judged(job: JobView, now: float) -> bool:
    return (
        job.deadline is not None and job.remaining_samples > 0 and job.on_demand_limit > 0 and job.submitted_at <= now
    )


def _need(
    job: JobView, jobs: Sequence[JobView], fixed: Mapping[str, int], outlook: Outlook, config: DeadlineConfig
) -> OnDemandNeed:
    held = fixed[job.name]  # held and pending

    def meets(gpus: int, later: float = 0.0) -> bool:
        wanted = 1.0 + (config.release_margin if gpus < held else config.margin)
        arrives = outlook.now + later + (config.on_demand_start_seconds if gpus > held else 0.0)
        done = project(jobs, {**fixed, job.name: gpus}, {job.name: arrives}, outlook, {job.name: wanted})
        return done.get(job.name, 0.0) >= job.remaining_samples * wanted * (1.0 - 1e-9)

    if held and not meets(0):  # fewer, longer holds: what it holds stays until spot alone meets it again
        low, high = held, job.on_demand_limit
    else:
        low, high = 0, job.on_demand_limit
    while low < high:  # meets() only gets easier with more GPUs: a binary search
        middle = (low + high) // 2
        low, high = (low, middle) if meets(middle) else (middle + 1, high)
    if low > held and config.defer and meets(low, outlook.step_seconds):
        low = held  # just in time: the same GPUs arriving a step later still meet it, so none are bought yet
    if job.on_demand_pending > 0:
        low = max(low, held)  # waiting for the capacity it asked for: its level stays until that arrived
    if low == 0:
        return OnDemandNeed(job.name, 0, CapacityCause.SPOT_RETURNED if job.held_gpus(PoolKind.ON_DEMAND) else None)
    return OnDemandNeed(job.name, low, CapacityCause.DEADLINE_AT_RISK)


def project(
    jobs: Sequence[JobView],
    fixed: Mapping[str, int],
    arrives: Mapping[str, float],
    outlook: Outlook,
    scale: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Samples each job with a deadline is expected to do from ``outlook.now`` to its deadline (at most its work
    left times ``scale[job]``, default 1), on ``fixed[job]`` on-demand GPUs (counted from ``arrives[job]``, before
    that only those it holds) and its expected spot share."""
    now, step, per_node = outlook.now, outlook.step_seconds, outlook.gpus_per_node
    order = sorted(
        (j for j in jobs if j.remaining_samples > 0),
        key=lambda j: (-j.priority, math.inf if j.deadline is None else j.deadline, j.submitted_at, j.name),
    )
    left = {j.name: j.remaining_samples * (scale or {}).get(j.name, 1.0) for j in order}
    done = {j.name: 0.0 for j in order if j.deadline is not None}
    end = max((j.deadline for j in order if j.deadline is not None), default=now)
    nodes = outlook.spot_gpus // per_node if per_node > 0 else 0
    t = now
    while t < end and any(work > 0 for work in left.values()):
        free = float(nodes * per_node)
        for job in order:
            if left[job.name] <= 0 or job.submitted_at > t or (job.deadline is not None and t >= job.deadline):
                continue
            od = fixed.get(job.name, 0) if t >= arrives.get(job.name, now) else job.held_gpus(PoolKind.ON_DEMAND)
            od = min(od, job.max_gpus)
            spot = min(float(job.max_gpus - od), free, outlook.room_of(job.name))
            rate = _rate(job, od + spot)
            if rate <= 0:
                continue
            free -= spot
            pause = min(1.0, outlook.spot.eviction * spot / per_node * job.morph_cost_seconds)
            span = step if job.deadline is None else min(step, job.deadline - t)
            work = min(left[job.name], rate * span * (1.0 - pause))
            left[job.name] -= work
            if job.name in done:
                done[job.name] += work
        t += step
    return done


def _rate(job: JobView, gpus: float) -> float:
    """Samples/s on a fractional count of GPUs (an expectation): between the counts around it."""
    whole = int(gpus)
    low, high = job.rate(whole), job.rate(whole + 1)
    return low + (high - low) * (gpus - whole) if high > 0 and low > 0 else low
