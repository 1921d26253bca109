"""A user's mistake for the end-to-end tests: the demo model with its loss scaled by 1e31 and a held-out set.

Training is unaffected in float64 (AdamW and clipping scale it away); the evaluation reports a finite loss
beyond what any controller accepts, which once made every agent that ran the job exit (a crash loop).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import torch

from worker_agent.runtime.model.model_api import ModelSpec

_spec = importlib.util.spec_from_file_location("tiny_gpt", Path(__file__).parents[2] / "examples" / "tiny_gpt.py")
assert _spec is not None and _spec.loader is not None
tiny_gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny_gpt)


def scaled_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss: torch.Tensor = tiny_gpt.per_sample_loss(logits, targets)
    return loss * 1e31


def build() -> ModelSpec:
    spec: ModelSpec = tiny_gpt.build()
    held_out = tiny_gpt.ProgressionDataset(32, 16, 32, 3)
    return dataclasses.replace(spec, loss=scaled_loss, eval_dataset=held_out)
