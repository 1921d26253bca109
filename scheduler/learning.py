"""A planner that learns: the profile's scaling corrected online from the step times a job measures.

The planner predicts a step time for each GPU count from a profile measured once on one GPU; a real cluster
differs (slower links, contention), and more so the more GPUs a layout spans. After each morph the caller
reports the layout's GPU count, the predicted and the measured step time (:func:`observe`). The correction is
a fit of ``log(measured / predicted) = a + b * log(gpus)`` by least squares over the newest observations, ``b``
held near zero by a ridge until several GPU counts have been seen: one factor for a model that is uniformly
off, a slope for one whose scaling is off. :func:`corrected_rates` turns a job's throughput curve into the
corrected one the allocation uses.

A growth that made the job slower is undone and its new nodes are not tried again for it
(:func:`judge_growth`, :func:`growth_allowed`); the measured slowdown is also an observation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum


@dataclass(frozen=True)
class Observation:
    gpus: int
    predicted_seconds: float
    measured_seconds: float


@dataclass(frozen=True)
class StepModel:
    """One job's correction: its newest observations (at most ``keep``) and the ridge on the slope."""

    observations: tuple[Observation, ...] = ()
    keep: int = 32
    ridge: float = 0.05

    def factor(self, gpus: int) -> float:
        """Measured over predicted step time expected on ``gpus`` GPUs (1.0 with nothing observed)."""
        a, b = _fit(self.observations, self.ridge)
        return math.exp(a + b * math.log(max(gpus, 1)))

    def correct(self, predicted_seconds: float, gpus: int) -> float:
        return predicted_seconds * self.factor(gpus)


def observe(model: StepModel, gpus: int, predicted_seconds: float, measured_seconds: float) -> StepModel:
    if gpus <= 0 or predicted_seconds <= 0 or measured_seconds <= 0:
        raise ValueError("gpus, predicted and measured step seconds must be > 0")
    newest = (*model.observations, Observation(gpus, predicted_seconds, measured_seconds))
    return replace(model, observations=newest[-model.keep :])


def _fit(observations: Iterable[Observation], ridge: float) -> tuple[float, float]:
    points = [(math.log(o.gpus), math.log(o.measured_seconds / o.predicted_seconds)) for o in observations]
    if not points:
        return 0.0, 0.0
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / (sxx + ridge)
    return mean_y - slope * mean_x, slope


def corrected_rates(rates: tuple[float, ...], model: StepModel) -> tuple[float, ...]:
    """A throughput curve (samples/s on 0..max GPUs) with each count's step time corrected."""
    return tuple(rate / model.factor(gpus) if rate > 0 else 0.0 for gpus, rate in enumerate(rates))


class GrowthCause(StrEnum):
    KEPT = "kept"  # the growth made the job faster (within tolerance)
    SLOWER = "slower"  # measured slower than before it: undo it, and do not grow onto those nodes again


@dataclass(frozen=True)
class GrowthVerdict:
    undo: bool
    cause: GrowthCause
    avoid_nodes: frozenset[str]
    detail: str


def judge_growth(
    before_samples_per_second: float,
    after_samples_per_second: float,
    added_nodes: Iterable[str],
    tolerance: float = 0.02,
) -> GrowthVerdict:
    """After a growth onto ``added_nodes``: undo it when the measured speed fell below the one before."""
    if before_samples_per_second <= 0 or after_samples_per_second < 0:
        raise ValueError("measured speeds must be > 0 before and >= 0 after")
    if after_samples_per_second >= before_samples_per_second * (1.0 - tolerance):
        return GrowthVerdict(False, GrowthCause.KEPT, frozenset(), "faster or the same")
    return GrowthVerdict(
        True,
        GrowthCause.SLOWER,
        frozenset(added_nodes),
        f"measured {after_samples_per_second:.1f} samples/s after growing, {before_samples_per_second:.1f} before",
    )


def growth_allowed(added_nodes: Iterable[str], avoided: Iterable[frozenset[str]]) -> bool:
    """Whether a growth onto ``added_nodes`` retries none of the growths undone before (same nodes again)."""
    adding = frozenset(added_nodes)
    return not any(bad and bad <= adding for bad in avoided)
