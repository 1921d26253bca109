"""The availability forecast's estimates and liveput; the online step-time correction; undone growths."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.forecast import PoolStats, Prior, Rates, liveput, observe, rates, seed_from_counts
from scheduler.learning import StepModel, corrected_rates, growth_allowed, judge_growth
from scheduler.learning import observe as learn
from scheduler.pools import PoolKind


def test_eviction_rate_is_recovered_from_a_seeded_history() -> None:
    rng, stats, live, now, true_rate = random.Random(7), PoolStats(PoolKind.SPOT), 20, 0.0, 1 / 7200
    stats = observe(stats, now, live)
    for _ in range(3000):
        now += 10.0
        evicted = sum(rng.random() < true_rate * 10 for _ in range(live))
        live = live - evicted + sum(rng.random() < 1e-3 * 10 for _ in range(20 - live + evicted))
        stats = observe(stats, now, live, evicted=evicted)
    estimate = rates(stats, Prior(0.0, 0.0, 0.0, 1e-9))
    assert estimate.eviction == pytest.approx(true_rate, rel=0.3)
    assert PoolStats.from_dict(stats.to_dict()) == stats
    assert rates(PoolStats(PoolKind.ON_DEMAND)) == Rates(0.0, 0.0)
    seeded = seed_from_counts(PoolKind.SPOT, [(0.0, 4), (3600.0, 2), (7200.0, 4)])
    assert seeded.evictions == 2 and seeded.live == 0


def test_liveput_is_below_the_gpus_present_when_evictions_are_likely() -> None:
    def curve(gpus: int) -> float:
        return float(gpus)

    calm = liveput(curve, 8, 1, 0, Rates(1e-9, 1e-3), 3600.0, 15.0)
    stormy = liveput(curve, 8, 1, 0, Rates(1e-3, 1e-6), 3600.0, 15.0)
    assert calm == pytest.approx(8.0, rel=0.01)
    assert stormy < 0.5 * calm
    assert liveput(curve, 8, 1, 4, Rates(1e-3, 1e-6), 3600.0, 15.0) > stormy


def test_the_correction_learns_a_scaling_the_profile_got_wrong() -> None:
    def truth(gpus: int) -> float:
        return float(1.3 * math.pow(gpus, 0.15))  # measured / predicted: slower, and worse with more GPUs

    model = StepModel()
    for gpus in (2, 4, 8):
        model = learn(model, gpus, 1.0, truth(gpus))
    for gpus in (1, 16, 32):
        assert abs(model.factor(gpus) - truth(gpus)) / truth(gpus) < 0.1
        assert abs(1.0 - truth(gpus)) / truth(gpus) > 0.2
    assert corrected_rates((0.0, 10.0), model)[1] == pytest.approx(10.0 / model.factor(1))
    assert math.isclose(StepModel().factor(8), 1.0)


def test_a_growth_that_made_the_job_slower_is_undone_and_not_retried_on_those_nodes() -> None:
    verdict = judge_growth(161.0, 153.0, ["n3", "n4"])
    assert verdict.undo and verdict.avoid_nodes == {"n3", "n4"}
    assert not judge_growth(161.0, 300.0, ["n3"]).undo
    assert not growth_allowed(["n3", "n4", "n5"], [verdict.avoid_nodes])
    assert growth_allowed(["n5"], [verdict.avoid_nodes])
