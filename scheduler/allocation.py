"""How many shared (spot) GPUs each job gets: by the samples/s they add, weighted by priority, none starved.

A GPU is worth to a job what it adds to the job's speed as a fraction of its full speed (so a small and a large
model compare), times ``2 ** effective_priority``; effective priority grows with the time a job has waited with
nothing (aging: ``aging_seconds`` a level). Free GPUs go, step by step, to the largest gain per GPU (a step may
span several GPUs: planner curves have plateaus). Jobs running keep what they hold, so nothing morphs for
nothing; a running job grows only when the growth pays for its morph (``morphing.policy.decide_morph``), and
is shrunk for a higher-priority job only when the weighted gain over the horizon pays for both morphs (and
stopped only once it ran ``min_run_seconds``). A job
that has waited ``starvation_seconds`` is served before anyone else, shrinking or stopping the lowest
priority jobs that ran ``min_run_seconds`` if it must: no job starves (with n jobs each needing every GPU, none
waits longer than ``starvation_seconds + (n - 1) * min_run_seconds``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from morphing.policy import PolicyConfig, decide_morph
from scheduler.jobs import JobView


class ShrinkCause(StrEnum):
    PRIORITY = "priority"  # a higher-priority job gains more over the horizon than this one loses, morphs paid
    STARVATION = "starvation"  # a job waited starvation_seconds: it is served before this one


@dataclass(frozen=True)
class Shrink:
    job: str
    from_gpus: int
    to_gpus: int
    cause: ShrinkCause
    for_job: str


@dataclass(frozen=True)
class ShareConfig:
    aging_seconds: float = 3600.0
    starvation_seconds: float = 2 * 3600.0
    horizon_seconds: float = 1800.0
    hysteresis: float = 0.05
    min_run_seconds: float = 3600.0  # a job runs this long before a higher priority may stop it (shrinks: any time)

    def __post_init__(self) -> None:
        if min(self.aging_seconds, self.starvation_seconds, self.horizon_seconds) <= 0 or self.hysteresis < 0:
            raise ValueError("aging, starvation and horizon seconds must be > 0 and hysteresis >= 0")


def effective_priority(job: JobView, config: ShareConfig) -> float:
    return job.priority + job.waited_seconds / config.aging_seconds


def _weight(job: JobView, config: ShareConfig) -> float:
    return float(2.0 ** max(-60.0, min(60.0, effective_priority(job, config))))


def _value(job: JobView, gpus: int) -> float:
    full = job.rate(job.max_gpus)
    return job.rate(gpus) / full if full > 0 else 0.0


@dataclass(frozen=True)
class _Step:
    gain: float
    job: str
    gpus: int


def _best_step(job: JobView, have: int, held: int, room: int, config: ShareConfig, base: int = 0) -> _Step | None:
    """The step of 1..room GPUs with the best weighted gain per GPU; a running job's first growth must pay.
    ``base``: GPUs the job has besides these (its on-demand ones): the step's value counts from them."""
    best: _Step | None = None
    for k in range(1, room + 1):
        if have == held > 0 and not _growth_pays(job, base + held, base + held + k, config):
            continue
        gain = _weight(job, config) * (_value(job, base + have + k) - _value(job, base + have)) / k
        if gain > 0 and (best is None or gain > best.gain):
            best = _Step(gain, job.name, k)
    return best


def _growth_pays(job: JobView, held: int, target: int, config: ShareConfig) -> bool:
    remaining = job.remaining_samples / job.rate(held) if job.rate(held) > 0 else None
    return decide_morph(
        current_samples_per_second=job.rate(held) or None,
        current_layout_intact=True,
        candidate_samples_per_second=job.rate(target) or None,
        morph_cost_seconds=job.morph_cost_seconds,
        config=PolicyConfig(config.horizon_seconds, config.hysteresis),
        remaining_seconds=remaining,
    ).morph


def share(
    jobs: Sequence[JobView],
    capacity: int,
    held: Mapping[str, int],
    demand: Mapping[str, int],
    config: ShareConfig = ShareConfig(),
    base: Mapping[str, int] | None = None,
) -> tuple[dict[str, int], tuple[Shrink, ...]]:
    """GPUs per job out of ``capacity`` (each at most its ``demand``), from what each ``held`` of it now, and
    the running jobs shrunk on the way (with why). ``base[job]``: GPUs it has outside ``capacity`` (its
    on-demand ones): what a GPU of ``capacity`` adds to it counts from those (two spot GPUs that make a job
    holding five on-demand GPUs run at its minimum of seven are worth the whole of its speed)."""
    off = base or {}
    if capacity < 0:
        raise ValueError(f"capacity {capacity}: it must be >= 0")
    counts = {job.name: max(0, min(held.get(job.name, 0), demand.get(job.name, 0))) for job in jobs}
    order = sorted(jobs, key=lambda j: (effective_priority(j, config), -j.submitted_at))
    for job in order:  # lowest first: what no longer fits (capacity fell) is taken from them
        excess = sum(counts.values()) - capacity
        counts[job.name] -= min(max(excess, 0), counts[job.name])
    shrinks = _serve_starving(jobs, capacity, counts, demand, config)
    _fill(jobs, capacity, counts, held, demand, config, off)
    shrinks += _preempt_for_priority(order, counts, demand, config, off)
    _fill(jobs, capacity, counts, held, demand, config, off)
    return counts, tuple(shrinks)


def _fill(
    jobs: Sequence[JobView],
    capacity: int,
    counts: dict[str, int],
    held: Mapping[str, int],
    demand: Mapping[str, int],
    config: ShareConfig,
    base: Mapping[str, int],
) -> None:
    while (free := capacity - sum(counts.values())) > 0:
        steps = [
            _best_step(
                job,
                counts[job.name],
                held.get(job.name, 0),
                min(free, demand.get(job.name, 0) - have),
                config,
                base.get(job.name, 0),
            )
            for job in jobs
            if (have := counts[job.name]) < demand.get(job.name, 0)
        ]
        found = [s for s in steps if s is not None]
        if not found:
            return
        best = max(found, key=lambda s: (s.gain, s.job))
        counts[best.job] += best.gpus


def _serve_starving(
    jobs: Sequence[JobView], capacity: int, counts: dict[str, int], demand: Mapping[str, int], config: ShareConfig
) -> list[Shrink]:
    shrinks: list[Shrink] = []
    starving = [j for j in jobs if j.waited_seconds >= config.starvation_seconds and counts[j.name] == 0]
    for job in sorted(starving, key=lambda j: -j.waited_seconds):
        need = job.min_gpus
        if need is None or need > demand.get(job.name, 0):
            continue
        short = need - (capacity - sum(counts.values()))
        victims = sorted(
            (j for j in jobs if counts[j.name] > 0 and j.running_seconds >= config.min_run_seconds),
            key=lambda j: (effective_priority(j, config), -j.submitted_at),
        )
        if short > sum(counts[v.name] for v in victims):
            continue
        for victim in victims:
            if short <= 0:
                break
            have = counts[victim.name]
            keep = have - short if have - short >= (victim.min_gpus or 0) else 0
            counts[victim.name] = keep
            short -= have - keep
            shrinks.append(Shrink(victim.name, have, keep, ShrinkCause.STARVATION, job.name))
        counts[job.name] = need
    return shrinks


def _preempt_for_priority(
    order: Sequence[JobView],
    counts: dict[str, int],
    demand: Mapping[str, int],
    config: ShareConfig,
    base: Mapping[str, int],
) -> list[Shrink]:
    """Move GPUs from lower- to higher-priority jobs where the weighted gain over the horizon pays both morphs."""
    shrinks: list[Shrink] = []
    for hi in reversed(order):
        for lo in order:
            if effective_priority(lo, config) >= effective_priority(hi, config) or counts[lo.name] == 0:
                continue
            room = min(counts[lo.name], demand.get(hi.name, 0) - counts[hi.name])
            for k in range(room, 0, -1):
                have, keep = counts[lo.name], counts[lo.name] - k
                if 0 < keep + base.get(lo.name, 0) < (lo.min_gpus or 0) or (
                    keep == 0 and lo.running_seconds < config.min_run_seconds
                ):
                    continue
                hi_at, lo_at = counts[hi.name] + base.get(hi.name, 0), have + base.get(lo.name, 0)
                if _trade(hi, hi_at, k, lo, lo_at, config) <= 0:
                    continue
                counts[lo.name], counts[hi.name] = keep, counts[hi.name] + k
                shrinks.append(Shrink(lo.name, have, keep, ShrinkCause.PRIORITY, hi.name))
                break
    return shrinks


def _trade(hi: JobView, hi_have: int, k: int, lo: JobView, lo_have: int, config: ShareConfig) -> float:
    """Weighted samples (fractions of each job) gained over the horizon by moving ``k`` GPUs from lo to hi."""
    horizon = config.horizon_seconds
    hi_after = max(0.0, horizon - hi.morph_cost_seconds)
    lo_after = max(0.0, horizon - lo.morph_cost_seconds) if lo_have - k > 0 else horizon
    gain = _weight(hi, config) * (_value(hi, hi_have + k) * hi_after - _value(hi, hi_have) * horizon)
    loss = _weight(lo, config) * (_value(lo, lo_have) * horizon - _value(lo, lo_have - k) * lo_after)
    return gain - loss
