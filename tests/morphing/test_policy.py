from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from morphing.policy import MorphReason, PolicyConfig, decide_morph

rates = st.floats(0.1, 1e4)


def test_start_when_nothing_runs() -> None:
    d = decide_morph(
        current_samples_per_second=None,
        current_layout_intact=True,
        candidate_samples_per_second=10.0,
        morph_cost_seconds=30,
    )
    assert d.morph and d.reason is MorphReason.START


def test_lost_capacity_forces_a_morph_even_to_a_slower_layout() -> None:
    d = decide_morph(
        current_samples_per_second=100.0,
        current_layout_intact=False,
        candidate_samples_per_second=10.0,
        morph_cost_seconds=1e6,
    )
    assert d.morph and d.reason is MorphReason.LOST_CAPACITY


def test_no_fit_waits() -> None:
    d = decide_morph(
        current_samples_per_second=100.0,
        current_layout_intact=False,
        candidate_samples_per_second=None,
        morph_cost_seconds=1,
    )
    assert not d.morph and d.reason is MorphReason.NO_FIT


def test_small_gain_is_within_hysteresis() -> None:
    d = decide_morph(
        current_samples_per_second=100.0,
        current_layout_intact=True,
        candidate_samples_per_second=103.0,
        morph_cost_seconds=0,
        config=PolicyConfig(horizon_seconds=600, hysteresis=0.05),
    )
    assert not d.morph and d.reason is MorphReason.WITHIN_HYSTERESIS


def test_gain_that_does_not_pay_back_the_morph_is_refused() -> None:
    d = decide_morph(
        current_samples_per_second=100.0,
        current_layout_intact=True,
        candidate_samples_per_second=120.0,
        morph_cost_seconds=200,
        config=PolicyConfig(horizon_seconds=600),
    )
    assert not d.morph and d.reason is MorphReason.NOT_WORTH_IT


def test_gain_that_pays_back_grows() -> None:
    d = decide_morph(
        current_samples_per_second=100.0,
        current_layout_intact=True,
        candidate_samples_per_second=200.0,
        morph_cost_seconds=30,
    )
    assert d.morph and d.reason is MorphReason.GROW
    assert d.expected_gain_samples == pytest.approx(200 * 570 - 100 * 600)


@given(rates, rates, st.floats(0, 1000), st.floats(1, 5000), st.floats(0, 0.5))
def test_grow_decision_matches_the_payback_rule(
    current: float, candidate: float, cost: float, horizon: float, hysteresis: float
) -> None:
    d = decide_morph(
        current_samples_per_second=current,
        current_layout_intact=True,
        candidate_samples_per_second=candidate,
        morph_cost_seconds=cost,
        config=PolicyConfig(horizon_seconds=horizon, hysteresis=hysteresis),
    )
    pays = candidate * max(0.0, horizon - cost) > current * horizon
    assert d.morph == (pays and candidate >= current * (1 + hysteresis))


def test_config_and_cost_are_validated() -> None:
    with pytest.raises(ValueError, match="horizon"):
        PolicyConfig(horizon_seconds=0)
    with pytest.raises(ValueError, match="morph_cost"):
        decide_morph(
            current_samples_per_second=1.0,
            current_layout_intact=True,
            candidate_samples_per_second=2.0,
            morph_cost_seconds=-1,
        )


def test_a_job_about_to_finish_does_not_grow() -> None:
    grow = {
        "current_samples_per_second": 100.0,
        "current_layout_intact": True,
        "candidate_samples_per_second": 200.0,
        "morph_cost_seconds": 30.0,
    }
    assert decide_morph(**grow, remaining_seconds=None).morph  # type: ignore[arg-type]
    assert decide_morph(**grow, remaining_seconds=3600.0).morph  # type: ignore[arg-type]
    assert not decide_morph(**grow, remaining_seconds=50.0).morph  # type: ignore[arg-type]
    assert decide_morph(**grow, remaining_seconds=0.0).reason is MorphReason.NOT_WORTH_IT  # type: ignore[arg-type]
