"""Layouts by liveput: never slower than the fastest by more than the loss it saves; the fastest without
evictions; a layout whose likely loss keeps its partition wins when nodes go often."""

from __future__ import annotations

import functools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from morphing.plan_result import Plan
from morphing.planner import Planner
from morphing.profile import parse_profile
from morphing.traces import Trace, TraceEvent
from scheduler.fleet import FleetConfig, FleetJob, replay_jobs
from scheduler.forecast import Rates
from scheduler.jobs import throughput_curve
from scheduler.layouts import LayoutOption, LossCosts, choose, judge, options, steadiest

PROFILE = parse_profile((Path(__file__).parents[2] / "examples" / "profiles" / "gpt48.json").read_text())


@functools.cache
def _options(batch: int, gpus: int) -> tuple[LayoutOption, ...]:
    return options(Planner(PROFILE, batch), gpus)


@st.composite
def candidates(draw: st.DrawFn) -> list[LayoutOption]:
    out = []
    for _ in range(draw(st.integers(1, 5))):
        gpus = draw(st.integers(1, 16))
        used = draw(st.integers(1, gpus))
        speed = draw(st.floats(0.0, 100.0))
        kept = draw(st.sampled_from([0.0, speed, speed / 2]))
        out.append(LayoutOption(speed, gpus, used, 1, 1, kept, draw(st.floats(0.0, 100.0))))
    return out


RATES = st.builds(Rates, st.floats(0.0, 1e-2), st.floats(0.0, 1e-2))


@settings(max_examples=200, deadline=None)
@given(candidates(), RATES, st.floats(60.0, 7200.0))
def test_never_slower_than_the_fastest_by_more_than_the_loss_it_saves(
    cands: list[LayoutOption], spot: Rates, horizon: float
) -> None:
    chosen = choose(cands, spot, 1, horizon)
    assert chosen is not None
    for other in cands:
        theirs = judge(other, spot, 1, horizon)
        speed_given_up = other.samples_per_second - chosen.option.samples_per_second
        loss_saved = theirs.expected_loss_samples_per_second - chosen.expected_loss_samples_per_second
        assert speed_given_up <= loss_saved + 1e-6 * (1 + other.samples_per_second)
        assert chosen.liveput >= theirs.liveput - 1e-9


def test_with_no_evictions_it_is_the_planners_fastest() -> None:
    for batch in (128, 512):
        planner = Planner(PROFILE, batch)
        for gpus in range(7, 17):
            opts = _options(batch, gpus)
            chosen = choose(opts, Rates(0.0, 1e-3), 1, 1800.0)
            fastest = planner.plan_gpus(gpus)
            assert isinstance(fastest, Plan) and chosen is not None
            assert chosen.liveput == chosen.option.samples_per_second == fastest.samples_per_second


def test_a_layout_whose_loss_keeps_its_partition_wins_when_nodes_go_often() -> None:
    """16 GPUs of GPT-48 at B 512: the fastest (8 stages x 2) re-partitions when it loses a node; 7 x 2 leaves
    two nodes idle, one of which takes a lost rank's place."""
    opts = _options(512, 16)
    calm = choose(opts, Rates(0.0, 1e-3))
    stormy = choose(opts, Rates(1.2 / 3600, 1 / 2520))
    assert calm is not None and stormy is not None
    assert (calm.option.stages, calm.option.replicas) == (8, 2) and not judge(
        calm.option, Rates(1e-3, 0), 1, 1800
    ).keeps_partition
    assert (stormy.option.stages, stormy.option.replicas) == (7, 2) and stormy.keeps_partition
    assert stormy.option.samples_per_second < calm.option.samples_per_second
    assert stormy.liveput > judge(calm.option, Rates(1.2 / 3600, 1 / 2520), 1, 1800).liveput
    free_reload = choose(opts, Rates(1.2 / 3600, 1 / 2520), costs=LossCosts(reload_seconds=0.0))
    assert free_reload is not None and free_reload.option == calm.option  # a re-partition that costs no more


def test_losses_cost_a_replica_layout_a_morph_and_a_single_copy_a_reload() -> None:
    two, one = LayoutOption(10.0, 16, 16, 8, 2, 6.0, 9.0), LayoutOption(10.0, 16, 16, 16, 1, 0.0, 9.0)
    spot, costs = Rates(1e-3, 1e-3), LossCosts(15.0, 60.0)
    assert judge(one, spot, 1, 1800.0, costs).loss_pause_seconds == 75.0
    assert judge(LayoutOption(10.0, 16, 14, 7, 2, 10.0, 9.0), spot, 1, 1800.0, costs).loss_pause_seconds == 15.0
    assert judge(two, spot, 1, 1800.0, costs).liveput > 0


def test_the_replay_pauses_a_job_for_what_each_loss_costs_its_layout() -> None:
    """16 nodes, one lost every 10 minutes and back 5 minutes later: the job with layouts pays pauses."""
    events = [TraceEvent(0.0, "add", f"n{i}") for i in range(16)]
    for k in range(12):
        events += [TraceEvent(600.0 * (k + 1), "remove", f"n{k}"), TraceEvent(600.0 * (k + 1) + 300, "add", f"n{k}")]
    trace = Trace(tuple(sorted(events, key=lambda e: e.seconds)), "events")
    curve = throughput_curve(Planner(PROFILE, 512), 16)
    job = FleetJob("j", curve, 512, 60)
    plain = replay_jobs([job], trace, "spotmorph", FleetConfig())["j"]
    laid = FleetJob("j", curve, 512, 60, layouts=tuple(_options(512, n) for n in range(17)))
    fastest = replay_jobs([laid], trace, "spotmorph", FleetConfig(layout_choice="fastest"))["j"]
    assert plain.loss_pause_hours == 0 and fastest.loss_pause_hours > 0
    assert fastest.finished_hour is not None and plain.finished_hour is not None
    assert fastest.finished_hour > plain.finished_hour  # the pauses cost time


def test_steadiest_runs_the_layout_whose_loss_keeps_its_partition_on_real_nodes_when_nodes_go_often() -> None:
    planner = Planner(PROFILE, 512)
    nodes = [(f"vm-{i}", 1) for i in range(16)]
    fastest = planner.plan(nodes)
    assert isinstance(fastest, Plan) and (fastest.layout.pipeline_stages, fastest.layout.data_parallel) == (8, 2)
    assert steadiest(planner, nodes, fastest, Rates(0.0, 1e-3)) is fastest  # no evictions: the fastest
    stormy = steadiest(planner, nodes, fastest, Rates(1.2 / 3600, 1 / 2520))
    assert (stormy.layout.pipeline_stages, stormy.layout.data_parallel) == (7, 2)
    assert set(stormy.layout.nodes()) <= {name for name, _ in nodes}
    assert stormy.notes[-1].startswith("liveput: 7x2") and "keeps its stage partition" in stormy.notes[-1]


@settings(max_examples=25, deadline=None)
@given(st.integers(7, 16), st.floats(0.0, 3.0 / 3600))
def test_steadiest_never_expects_less_than_the_fastest(gpus: int, eviction: float) -> None:
    planner = Planner(PROFILE, 512)
    nodes = [(f"vm-{i}", 1) for i in range(gpus)]
    fastest = planner.plan(nodes)
    assert isinstance(fastest, Plan)
    spot = Rates(eviction, 1 / 2520)
    chosen = steadiest(planner, nodes, fastest, spot)
    by_depth = {o.stages: o for o in _options(512, gpus)}
    mine, theirs = by_depth[chosen.layout.pipeline_stages], by_depth[fastest.layout.pipeline_stages]
    assert judge(mine, spot, 1, 1800.0).liveput >= judge(theirs, spot, 1, 1800.0).liveput - 1e-9
