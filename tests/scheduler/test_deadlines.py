"""Deadlines: spotmorph's policy meets every deadline on-demand-only meets, on synthetic traces; on-demand is
asked for only when needed and given back when spot returns."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from morphing.replay import ReplayConfig
from morphing.traces import Trace, TraceEvent
from scheduler.deadlines import CapacityCause, DeadlineConfig, on_demand_need
from scheduler.fleet import FleetConfig, FleetJob, replay_jobs
from scheduler.forecast import Rates
from scheduler.jobs import Grant, JobView
from scheduler.outlook import Outlook, needs
from scheduler.pools import PoolKind

CURVE = (0.0, *(100.0 * n**0.9 for n in range(1, 9)))


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Up to 8 one-GPU nodes over 6 hours, each coming and going at random (a seeded synthetic trace)."""
    events = []
    for node in range(draw(st.integers(0, 8))):
        t, up = draw(st.floats(0, 3600)), False
        while t < 6 * 3600:
            events.append(TraceEvent(t, "remove" if up else "add", f"n{node}"))
            up = not up
            t += draw(st.floats(300, 4 * 3600))
    events.sort(key=lambda e: e.seconds)
    return Trace((*events, TraceEvent(6 * 3600.0, "add", "end")), "events")


@settings(max_examples=25, deadline=None)
@given(traces(), st.lists(st.tuples(st.floats(0.5, 4.0), st.floats(0, 2), st.integers(0, 2)), min_size=1, max_size=3))
def test_spotmorph_meets_every_deadline_on_demand_only_meets(
    trace: Trace, specs: list[tuple[float, float, int]]
) -> None:
    jobs = [
        FleetJob(f"j{i}", CURVE, 64, int(hours * 3600 * CURVE[8] / 64 / 2.5), priority, hours, submit)
        for i, (hours, submit, priority) in enumerate(specs)
    ]
    config = FleetConfig(replay=ReplayConfig(notice_seconds=0.0), tick_seconds=120.0)
    on_demand = replay_jobs(jobs, trace, "on-demand-only", config)
    ours = replay_jobs(jobs, trace, "spotmorph", config)
    for name, outcome in on_demand.items():
        if outcome.met_deadline:
            assert ours[name].met_deadline, (name, ours[name], outcome)


def _job(remaining_hours_on_max: float, deadline: float, held: tuple[Grant, ...] = ()) -> JobView:
    return JobView("j", CURVE, CURVE[8] * remaining_hours_on_max * 3600, deadline=deadline, held=held)


def test_on_demand_is_asked_for_only_when_the_forecast_misses_the_deadline() -> None:
    calm, stormy = Rates(1e-7, 1e-3), Rates(1e-3, 1e-6)
    config = DeadlineConfig()
    assert on_demand_need(_job(1.0, 4 * 3600.0), 8, 1, calm, 0.0, config).gpus == 0
    risky = on_demand_need(_job(1.0, 4 * 3600.0), 8, 1, stormy, 0.0, config)
    assert risky.gpus > 0 and risky.cause is CapacityCause.DEADLINE_AT_RISK
    last = on_demand_need(_job(1.0, 1.2 * 3600.0), 8, 1, calm, 0.0, config)
    assert last.gpus == 8 and last.cause is CapacityCause.LAST_SAFE_MOMENT


def test_on_demand_is_given_back_when_spot_returns() -> None:
    held = (Grant("j", "od-1", PoolKind.ON_DEMAND, 4),)
    back = on_demand_need(_job(1.0, 5 * 3600.0, held), 8, 1, Rates(1e-7, 1e-3), 0.0, DeadlineConfig())
    assert back.gpus == 0 and back.cause is CapacityCause.SPOT_RETURNED


def test_a_job_waiting_for_on_demand_gpus_keeps_its_level_whatever_spot_seems_to_do() -> None:
    """Asked for four on-demand GPUs, two arrived: spot that looks back (eight GPUs, calm) does not take the level
    back while the rest is on its way; once nothing is pending, spot returning gives them all back."""
    held = (Grant("j", "od-1", PoolKind.ON_DEMAND, 2),)
    waiting = replace(_job(1.0, 5 * 3600.0, held), on_demand_pending=2)
    calm = Rates(1e-7, 1e-3)
    kept = on_demand_need(waiting, 8, 1, calm, 0.0, DeadlineConfig())
    assert kept.gpus == 4 and kept.cause is CapacityCause.DEADLINE_AT_RISK
    for job in (waiting, replace(waiting, held=())):
        (need,) = needs([job], {"j": 8}, Outlook(8, 1, calm, 0.0), DeadlineConfig())
        assert need.gpus == job.held_gpus(PoolKind.ON_DEMAND) + 2
    arrived = replace(waiting, on_demand_pending=0)
    assert on_demand_need(arrived, 8, 1, calm, 0.0, DeadlineConfig()).gpus == 0
    (back,) = needs([arrived], {"j": 8}, Outlook(8, 1, calm, 0.0), DeadlineConfig())
    assert back.gpus == 0 and back.cause is CapacityCause.SPOT_RETURNED
