"""What the planner answers: a plan (a layout with its predicted cost) or the reason none fits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from morphing.jobspec import Schedule
from morphing.layout import Layout
from morphing.stages import StageMemory


@dataclass(frozen=True)
class Plan:
    layout: Layout
    schedule: Schedule
    gpus: int
    predicted_step_seconds: float
    samples_per_second: float
    bubble_fraction: float
    stage_memory: tuple[StageMemory, ...]
    notes: tuple[str, ...] = ()
    feasible: Literal[True] = True

    @property
    def gpus_used(self) -> int:
        return self.layout.world_size

    def to_dict(self) -> dict[str, Any]:
        layout = self.layout
        return {
            "gpus": self.gpus,
            "feasible": True,
            "gpus_used": self.gpus_used,
            "pipeline_stages": layout.pipeline_stages,
            "data_parallel": layout.data_parallel,
            "micro_batch_size": layout.micro_batch_size,
            "global_batch": layout.global_batch,
            "schedule": self.schedule,
            "samples_per_replica": list(layout.samples_per_replica),
            "micro_batches_per_replica": list(layout.micro_batches_per_replica),
            "stage_layers": [list(r) for r in layout.stage_layers],
            "predicted_step_seconds": self.predicted_step_seconds,
            "samples_per_second": self.samples_per_second,
            "bubble_fraction": self.bubble_fraction,
            "stage_memory_bytes": [m.total for m in self.stage_memory],
            "placement": [[s.node, s.slot] for s in layout.placement],
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class Infeasible:
    gpus: int
    reason: str
    feasible: Literal[False] = False

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "feasible": False, "reason": self.reason}


PlanResult = Plan | Infeasible


def throughput(result: PlanResult) -> float:
    return result.samples_per_second if isinstance(result, Plan) else 0.0
