"""The fp16 loss scale as a pure state machine, so that it is the same on every rank of every layout.

fp16 gradients underflow unless the loss is multiplied by a large factor first. The factor is a power of
two (scaling by it, and unscaling, is exact), halved after a step whose gradients hold an inf or NaN (the
update is skipped) and doubled after ``growth_interval`` clean steps in a row, as torch's ``GradScaler``
does. Unlike ``GradScaler`` the overflow decision is global: every rank contributes a flag to one
all-reduce over all ranks, so every rank applies the same sequence of decisions and holds the same
scale. The state is two numbers, checkpointed in the manifest, so a resumed run continues the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INITIAL_SCALE = 2.0**16
MIN_SCALE = 1.0
MAX_SCALE = 2.0**24
GROWTH_INTERVAL = 2000


@dataclass(frozen=True)
class LossScale:
    """The current scale and the clean steps since it last changed."""

    scale: float = INITIAL_SCALE
    good_steps: int = 0

    def after(self, overflow: bool, growth_interval: int = GROWTH_INTERVAL) -> LossScale:
        """The state after a step whose gradients overflowed (anywhere, on any rank) or did not."""
        if overflow:
            return LossScale(max(MIN_SCALE, self.scale / 2), 0)
        good = self.good_steps + 1
        if good >= growth_interval:
            return LossScale(min(MAX_SCALE, self.scale * 2), 0)
        return LossScale(self.scale, good)

    def to_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossScale:
        return cls(float(data["scale"]), int(data["good_steps"]))
