from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from morphing.planner import Plan, Planner
from morphing.profile import parse_profile
from morphing.replay import POLICIES, Replay, ReplayConfig, simulate_policies
from morphing.traces import Trace, TraceEvent, parse_trace

ROOT = Path(__file__).resolve().parents[2]
GPT48 = parse_profile((ROOT / "examples" / "profiles" / "gpt48.json").read_text())


def _steady(nodes: int, hours: float) -> Trace:
    events = [TraceEvent(0.0, "add", f"n{i}") for i in range(nodes)]
    events.append(TraceEvent(hours * 3600, "add", "late"))
    return Trace(tuple(events), "events")


def test_steady_cluster_costs_each_policy_only_its_start() -> None:
    config = ReplayConfig(gpus_per_node=8)
    planner = Planner(GPT48, 256)
    report = simulate_policies(planner, _steady(4, 2.0), config)["policies"]
    plan = Replay(planner, config).plan(4)
    assert isinstance(plan, Plan)
    duration = 2.0 * 3600
    assert report["oracle"]["samples"] == pytest.approx(plan.samples_per_second * duration)
    start = config.debounce_seconds + config.morph_cost_seconds
    assert report["spotmorph"]["samples"] == pytest.approx(plan.samples_per_second * (duration - start))
    assert report["spotmorph"]["morphs"] == 1
    assert report["spotmorph"]["steps_lost"] == 0


random_steps = st.lists(st.tuples(st.floats(1, 3000), st.booleans(), st.integers(0, 11)), min_size=1, max_size=40)


def _to_trace(steps: list[tuple[float, bool, int]]) -> Trace:
    events, now = [TraceEvent(0.0, "add", f"n{i}") for i in range(6)], 0.0
    live = {f"n{i}" for i in range(6)}
    for gap, add, index in steps:
        now += gap
        name = f"n{index}"
        if add and name not in live:
            live.add(name)
            events.append(TraceEvent(now, "add", name))
        elif not add and name in live:
            live.remove(name)
            events.append(TraceEvent(now, "remove", name))
    events.append(TraceEvent(now + 600, "add", "end"))
    return Trace(tuple(events), "events")


@settings(max_examples=30, deadline=None)
@given(random_steps, st.sampled_from([0.0, 30.0, 120.0]))
@example([(1.0, True, 6), (1.0, False, 6)], 30.0)  # a notice earlier than its VM's arrival once came first
def test_no_policy_beats_the_oracle(steps: list[tuple[float, bool, int]], notice: float) -> None:
    trace = _to_trace(steps)
    report = simulate_policies(Planner(GPT48, 128), trace, ReplayConfig(gpus_per_node=4, notice_seconds=notice))
    oracle = report["policies"]["oracle"]["samples"]
    for name in POLICIES:
        row = report["policies"][name]
        assert row["samples"] <= oracle * (1 + 1e-9) + 1e-6
        assert row["steps_lost"] >= 0


def test_without_notice_spotmorph_loses_at_most_its_checkpoint_interval_per_loss() -> None:
    events = [TraceEvent(0.0, "add", f"n{i}") for i in range(4)]
    events += [TraceEvent(3000.0, "remove", "n3"), TraceEvent(7200.0, "add", "end")]
    config = ReplayConfig(gpus_per_node=8, notice_seconds=0.0)
    planner = Planner(GPT48, 256)
    report = simulate_policies(planner, Trace(tuple(events), "events"), config)["policies"]["spotmorph"]
    plan = Replay(planner, config).plan(4)
    assert plan is not None
    worst = plan.samples_per_second * config.spotmorph_checkpoint_interval_seconds / 256
    assert 0 < report["steps_lost"] <= worst


def test_shipped_trace_spotmorph_near_oracle_and_ahead_of_baselines() -> None:
    trace = parse_trace((ROOT / "examples" / "traces" / "aws-p3-spot.csv").read_text())
    report = simulate_policies(Planner(GPT48, 512), trace, ReplayConfig())["policies"]
    assert report["spotmorph"]["goodput_vs_oracle"] >= 0.9
    assert report["spotmorph"]["samples"] > report["fixed-pipeline-restart"]["samples"]
    assert report["spotmorph"]["samples"] > report["data-parallel-only"]["samples"]
