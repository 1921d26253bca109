"""The cluster outlook behind spotmorph's forecast rule: a job counts on the spot GPUs others leave when they
finish, and keeps the on-demand GPUs it holds until spot alone meets its deadline by the release margin."""

from __future__ import annotations

from dataclasses import replace

from scheduler.deadlines import CapacityCause, DeadlineConfig
from scheduler.forecast import Rates
from scheduler.jobs import Grant, JobView, Node
from scheduler.outlook import Outlook, needs, project
from scheduler.policy import SchedulerConfig, decide
from scheduler.pools import PoolKind

CURVE = (0.0, *(100.0 * n**0.9 for n in range(1, 9)))
CALM = Rates(1e-6, 1e-3)
HOUR = 3600.0


def _spot(n: int) -> list[Node]:
    return [Node(f"s{i}", PoolKind.SPOT, 1) for i in range(n)]


def _busy_and_new() -> list[JobView]:
    """``busy`` holds all 8 spot GPUs and finishes in 10 minutes; ``new`` just arrived with 1 hour of work on 8
    GPUs and a deadline 4 hours away."""
    held = tuple(Grant("busy", f"s{i}", PoolKind.SPOT, 1) for i in range(8))
    busy = JobView("busy", CURVE, CURVE[8] * 600.0, priority=2, held=held)
    new = JobView("new", CURVE, CURVE[8] * HOUR, deadline=4 * HOUR)
    return [busy, new]


def test_a_job_counts_on_the_spot_gpus_a_finishing_job_leaves() -> None:
    jobs = _busy_and_new()
    ours = decide(jobs, _spot(8), CALM, 0.0, SchedulerConfig())
    assert ours.gpus("new", PoolKind.ON_DEMAND) == 0 and not ours.capacity
    # The per-job rule (no outlook) sees no spot share for it now and asks for on-demand GPUs at once.
    alone = SchedulerConfig(deadlines=DeadlineConfig(outlook=False))
    assert any(c.job == "new" and c.gpus > 0 for c in decide(jobs, _spot(8), CALM, 0.0, alone).capacity)


def test_the_projection_gives_a_finished_jobs_share_to_the_next() -> None:
    jobs = _busy_and_new()
    done = project(jobs, {}, {}, Outlook(8, 1, CALM, 0.0))
    assert done["new"] >= jobs[1].remaining_samples * 0.999
    few = project(jobs, {}, {}, Outlook(4, 1, CALM, 0.0))  # 4 GPUs from 10 minutes on: 3h50 at rate(4)
    assert few["new"] < CURVE[4] * 4 * HOUR


def test_on_demand_is_kept_until_spot_alone_meets_the_release_margin() -> None:
    """Spot alone (4 GPUs) beats the work left by 20%: enough not to ask (margin 0.15), not enough to give back
    (0.4); one on-demand GPU more would beat it by 46%, yet the two held are not given back one by one."""
    work = CURVE[4] * 3 * HOUR / 1.2
    config = DeadlineConfig()
    fresh = JobView("j", CURVE, work, deadline=3 * HOUR)
    outlook = Outlook(4, 1, Rates(0.0, 0.0), 0.0, 600.0)
    assert needs([fresh], {"j": 4}, outlook, config)[0].gpus == 0
    holding = replace(fresh, held=(Grant("j", "od-1", PoolKind.ON_DEMAND, 2),))
    kept = needs([holding], {"j": 4}, outlook, config)[0]
    assert kept.gpus == 2 and kept.cause is CapacityCause.DEADLINE_AT_RISK
    plenty = replace(holding, remaining_samples=work / 2)
    back = needs([plenty], {"j": 4}, outlook, config)[0]
    assert back.gpus == 0 and back.cause is CapacityCause.SPOT_RETURNED


def test_a_job_not_yet_submitted_asks_for_nothing() -> None:
    later = JobView("later", CURVE, CURVE[8] * 10 * HOUR, submitted_at=HOUR, deadline=2 * HOUR)
    need = needs([later], {}, Outlook(0, 1, CALM, 0.0), DeadlineConfig())[0]
    assert need.gpus == 0 and need.cause is None


def test_on_demand_gpus_are_bought_when_first_needed() -> None:
    """Spot alone (4 GPUs) leaves the job short, but an on-demand GPU bought a step (10 minutes) later meets it
    as well as one bought now: none is bought yet (the earlier rule bought it at once)."""
    work = CURVE[5] * 3 * HOUR / 1.1
    job = JobView("j", CURVE, work, deadline=3 * HOUR)
    outlook = Outlook(4, 1, Rates(0.0, 0.0), 0.0, 600.0)
    now = needs([job], {"j": 4}, outlook, DeadlineConfig())[0]
    assert now.gpus == 0 and now.cause is None
    eager = needs([job], {"j": 4}, outlook, DeadlineConfig(defer=False))[0]
    assert eager.gpus == 1 and eager.cause is CapacityCause.DEADLINE_AT_RISK
    late = replace(job, deadline=HOUR + 4 * 60.0, remaining_samples=CURVE[5] * HOUR * 0.98)  # a step later: short
    assert needs([late], {"j": 4}, outlook, DeadlineConfig())[0].gpus >= 1
