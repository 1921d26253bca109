"""The fp16 loss scale: a pure function of the sequence of global overflow decisions, kept in the manifest."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from worker_agent.runtime.numerics.loss_scale import INITIAL_SCALE, MAX_SCALE, MIN_SCALE, LossScale
from worker_agent.runtime.storage.manifest import LossScaleState

flags = st.lists(st.booleans(), max_size=300)
intervals = st.integers(1, 50)


def fold(state: LossScale, overflows: list[bool], interval: int) -> LossScale:
    for overflow in overflows:
        state = state.after(overflow, interval)
    return state


@given(flags, intervals)
def test_the_scale_stays_a_power_of_two_within_its_bounds(overflows: list[bool], interval: int) -> None:
    state = LossScale()
    for overflow in overflows:
        state = state.after(overflow, interval)
        assert MIN_SCALE <= state.scale <= MAX_SCALE
        assert math.frexp(state.scale)[0] == 0.5  # scaling and unscaling by it are exact
        assert 0 <= state.good_steps < interval


@given(flags, intervals)
def test_an_overflow_halves_the_scale_and_restarts_the_count(overflows: list[bool], interval: int) -> None:
    state = fold(LossScale(), overflows, interval)
    after = state.after(True, interval)
    assert after == LossScale(max(MIN_SCALE, state.scale / 2), 0)


@given(st.integers(1, 50), st.sampled_from([1.0, 2.0**10, INITIAL_SCALE, MAX_SCALE]))
def test_the_scale_doubles_after_interval_clean_steps(interval: int, scale: float) -> None:
    state = fold(LossScale(scale, 0), [False] * (interval - 1), interval)
    assert state == LossScale(scale, interval - 1)
    assert state.after(False, interval) == LossScale(min(MAX_SCALE, scale * 2), 0)


@given(flags, flags, intervals)
def test_the_state_is_a_function_of_the_decisions_alone(first: list[bool], then: list[bool], interval: int) -> None:
    """Every rank folds the same all-reduced flags, and a resumed run folds the rest from the saved state."""
    whole = fold(LossScale(), first + then, interval)
    saved = LossScale.from_dict(fold(LossScale(), first, interval).to_dict())
    assert fold(saved, then, interval) == whole


def test_the_manifest_field_round_trips_and_refuses_nonsense() -> None:
    state = LossScale(2.0**12, 7)
    assert LossScale.from_dict(LossScaleState.model_validate(state.to_dict()).model_dump()) == state
    for bad in ({"scale": 0.0, "good_steps": 1}, {"scale": 2.0, "good_steps": -1}, {"scale": 2.0}):
        with pytest.raises(ValidationError):
            LossScaleState.model_validate(bad)
