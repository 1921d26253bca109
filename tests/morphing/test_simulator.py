from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from morphing.simulator import (
    StageTiming,
    closed_form_bubble,
    closed_form_step,
    op_order,
    simulate,
)

schedules = st.sampled_from(["1f1b", "gpipe"])


@given(st.integers(1, 40), st.integers(1, 12), st.floats(1e-3, 10), st.floats(1e-3, 10), schedules)
def test_uniform_stages_match_the_closed_forms(m: int, p: int, f: float, b: float, schedule: str) -> None:
    result = simulate([StageTiming(f, b)] * p, m, schedule)  # type: ignore[arg-type]
    assert math.isclose(result.step_seconds, closed_form_step(m, p, f, b), rel_tol=1e-9)
    assert math.isclose(result.bubble_fraction, closed_form_bubble(m, p), rel_tol=1e-9, abs_tol=1e-12)


@given(st.integers(1, 30), st.integers(1, 10), schedules)
def test_every_stage_runs_each_forward_and_backward_once_forward_first(m: int, p: int, schedule: str) -> None:
    for stage in range(p):
        order = op_order(schedule, stage, p, m)  # type: ignore[arg-type]
        assert sorted(order) == sorted([(True, i) for i in range(m)] + [(False, i) for i in range(m)])
        for i in range(m):
            assert order.index((True, i)) < order.index((False, i))


def test_1f1b_holds_at_most_p_minus_s_micro_batches_in_flight() -> None:
    p, m = 4, 10
    for stage in range(p):
        live = peak = 0
        for forward, _ in op_order("1f1b", stage, p, m):
            live += 1 if forward else -1
            peak = max(peak, live)
        assert peak == min(p - stage, m)


@given(
    st.lists(st.tuples(st.floats(1e-3, 1), st.floats(1e-3, 1)), min_size=1, max_size=6),
    st.integers(1, 16),
    schedules,
    st.floats(0, 0.5),
)
def test_communication_and_allreduce_never_make_a_step_faster(
    stages: list[tuple[float, float]], m: int, schedule: str, comm: float
) -> None:
    plain = simulate([StageTiming(f, b) for f, b in stages], m, schedule)  # type: ignore[arg-type]
    costly = simulate([StageTiming(f, b, comm, comm) for f, b in stages], m, schedule)  # type: ignore[arg-type]
    assert costly.step_seconds >= plain.step_seconds - 1e-12
    bottleneck = max(f + b for f, b in stages)
    assert plain.step_seconds >= m * bottleneck - 1e-12
    assert plain.step_seconds >= sum(f + b for f, b in stages) - 1e-12


def test_allreduce_of_the_slowest_stage_ends_the_step() -> None:
    result = simulate([StageTiming(1.0, 2.0, 0.0, 5.0), StageTiming(1.0, 2.0)], 2, "1f1b")
    assert result.pipeline_seconds == pytest.approx(closed_form_step(2, 2, 1.0, 2.0))
    assert result.step_seconds == pytest.approx(result.stage_finish[0] + 5.0)


def test_send_time_lengthens_the_critical_path_by_two_hops_per_boundary() -> None:
    base = simulate([StageTiming(1.0, 1.0)] * 2, 1, "gpipe").step_seconds
    with_send = simulate([StageTiming(1.0, 1.0, 0.25), StageTiming(1.0, 1.0)], 1, "gpipe").step_seconds
    assert with_send == pytest.approx(base + 0.5)


def test_unknown_schedule_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        op_order("interleaved", 0, 2, 2)  # type: ignore[arg-type]
