"""Entrypoints for the precision tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from tests.runtime.helpers import REPO
from worker_agent.runtime.model.entrypoint import load_entrypoint
from worker_agent.runtime.model.model_api import ModelSpec


def build_loud() -> ModelSpec:
    """The tiny GPT with its loss multiplied by 10^4: fp16 gradients overflow at the initial loss scale
    (2^16), so the first steps are skipped and the scale halves until they fit."""
    build_config: Callable[..., ModelSpec] = load_entrypoint(f"{REPO}/examples/tiny_gpt.py:build_config")
    spec = build_config(d_model=16, blocks=2, seq_len=8, dataset_size=512, vocab=16)
    quiet = spec.loss

    def loud(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return quiet(output, targets) * 1e4

    return dataclasses.replace(spec, loss=loud, name="loud")
