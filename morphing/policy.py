"""Morph policy: given the running layout and a changed set of GPUs, is a morph worth it now?

A morph costs ``morph_cost_seconds`` of no training (stop, checkpoint, restart, load). It pays when
the samples trained over the expected time until the next availability change (``horizon``) beat
staying put: ``new * (horizon - cost) > current * horizon``; and, so that small predicted gains
(inside the model's error) do not cause churn, the new layout must be faster by a hysteresis margin.
A layout that lost a GPU cannot keep running: it must morph whatever the cost. A job that will finish
sooner than the horizon only counts the time it has left: growing a job two steps before its end
never pays.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class MorphReason(StrEnum):
    START = "start"  # nothing runs yet and a layout fits
    LOST_CAPACITY = "lost_capacity"  # the running layout uses a GPU that is gone or going
    GROW = "grow"  # more throughput on the GPUs now available pays for the morph
    NO_FIT = "no_fit"  # no layout fits the GPUs available: wait
    NOT_WORTH_IT = "not_worth_it"  # the gain does not pay for the morph within the horizon
    WITHIN_HYSTERESIS = "within_hysteresis"  # gain smaller than the hysteresis margin


@dataclass(frozen=True)
class MorphDecision:
    morph: bool
    reason: MorphReason
    detail: str
    expected_gain_samples: float = 0.0


@dataclass(frozen=True)
class PolicyConfig:
    horizon_seconds: float = 600.0
    hysteresis: float = 0.05

    def __post_init__(self) -> None:
        if self.horizon_seconds <= 0:
            raise ValueError(f"horizon_seconds={self.horizon_seconds}; it must be > 0")
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis={self.hysteresis}; it must be >= 0")


def decide_morph(
    *,
    current_samples_per_second: float | None,
    current_layout_intact: bool,
    candidate_samples_per_second: float | None,
    morph_cost_seconds: float,
    config: PolicyConfig = PolicyConfig(),
    remaining_seconds: float | None = None,
) -> MorphDecision:
    """Whether to morph now.

    ``current_samples_per_second`` is ``None`` when nothing runs; ``candidate_samples_per_second``
    is ``None`` when no layout fits the GPUs available; ``current_layout_intact`` is false when the
    running layout uses a GPU that is gone or has an eviction notice; ``remaining_seconds`` is how long
    the job still has to run at its current speed (``None``: unknown, use the horizon).
    """
    if morph_cost_seconds < 0:
        raise ValueError(f"morph_cost_seconds={morph_cost_seconds}; it must be >= 0")
    if candidate_samples_per_second is None or candidate_samples_per_second <= 0:
        return MorphDecision(False, MorphReason.NO_FIT, "no layout fits the GPUs available; waiting for capacity")
    if current_samples_per_second is None:
        return MorphDecision(True, MorphReason.START, "nothing runs and a layout fits")
    if not current_layout_intact:
        return MorphDecision(True, MorphReason.LOST_CAPACITY, "the running layout lost a GPU")
    horizon = config.horizon_seconds if remaining_seconds is None else min(config.horizon_seconds, remaining_seconds)
    if horizon <= 0:
        return MorphDecision(False, MorphReason.NOT_WORTH_IT, "the job is about to finish")
    gain = candidate_samples_per_second * max(0.0, horizon - morph_cost_seconds) - current_samples_per_second * horizon
    if candidate_samples_per_second < current_samples_per_second * (1.0 + config.hysteresis):
        return MorphDecision(
            False,
            MorphReason.WITHIN_HYSTERESIS,
            f"{candidate_samples_per_second:.2f} samples/s is not {config.hysteresis:.0%} above "
            f"{current_samples_per_second:.2f}",
            gain,
        )
    if gain <= 0:
        return MorphDecision(
            False,
            MorphReason.NOT_WORTH_IT,
            f"a {morph_cost_seconds:.1f} s morph does not pay back within {horizon:.0f} s",
            gain,
        )
    return MorphDecision(
        True,
        MorphReason.GROW,
        f"{candidate_samples_per_second:.2f} vs {current_samples_per_second:.2f} samples/s pays back "
        f"{gain:.0f} samples within {horizon:.0f} s",
        gain,
    )
