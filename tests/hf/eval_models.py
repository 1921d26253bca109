"""Entrypoints with an eval dataset for the evaluation tests (dropout on, so eval must turn it off)."""

from __future__ import annotations

import torch

from spotmorph import ModelSpec
from spotmorph.hf import causal_lm_spec
from tests.hf.hf_models import LabelledSequences, gpt2_model


class HeldOut(LabelledSequences):
    """Other seeded sequences than the training set's, 11 of them (no multiple of the batch)."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return super().__getitem__(index + 500)


def gpt2_eval() -> ModelSpec:
    return causal_lm_spec(gpt2_model(), LabelledSequences(), eval_dataset=HeldOut(size=11))


def gpt2_eval_sample() -> ModelSpec:
    return causal_lm_spec(gpt2_model(), LabelledSequences(), eval_dataset=HeldOut(size=11), loss_normalization="sample")


def gpt2_no_eval() -> ModelSpec:
    return causal_lm_spec(gpt2_model(), LabelledSequences())
