"""The salvage order: which surviving ranks write the just-in-time checkpoint of an unplanned loss.

The controller chooses one writer per pipeline stage among the ranks that hold the same last completed
step (each layer is written once); the agent publishes the order in the generation's control dir
(``control/salvage.json``, written whole) and the holding trainers read it. The first writer (stage 0's)
commits the manifest once every writer's part is there. Nothing is written after ``deadline``: by then
the controller has fallen back to the newest periodic checkpoint.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from worker_agent.contract.hostile import parse_json_bounded


@dataclass(frozen=True)
class SalvageOrder:
    step: int
    writers: tuple[int, ...]  # one rank per stage, in stage order
    deadline: float  # unix seconds

    @property
    def committer(self) -> int:
        return self.writers[0]

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "writers": list(self.writers), "deadline": self.deadline})

    @classmethod
    def from_json(cls, text: str) -> SalvageOrder:
        """The order a file holds; ``ValueError`` for anything that is not one (a deadline of NaN included)."""
        data = parse_json_bounded(text, "the salvage order")
        if not isinstance(data, dict):
            raise ValueError("a salvage order is a JSON object")
        step, writers, deadline = data.get("step"), data.get("writers"), data.get("deadline")
        if not isinstance(step, int) or step < 0 or isinstance(step, bool):
            raise ValueError(f"salvage step {step!r} is not a step")
        if not isinstance(writers, list) or not writers or not all(isinstance(w, int) and w >= 0 for w in writers):
            raise ValueError(f"salvage writers {writers!r} are not ranks")
        if not isinstance(deadline, int | float) or isinstance(deadline, bool) or not math.isfinite(deadline):
            raise ValueError(f"salvage deadline {deadline!r} is not a time")
        return cls(step, tuple(writers), float(deadline))
