"""Activation recomputation is exact: a layer rerun in backward sees the same input and draws the same
layout-free dropout masks, so gradients equal those of a run that kept its activations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.runtime.helpers import REPO, train
from worker_agent.runtime.model.entrypoint import load_entrypoint
from worker_agent.runtime.model.model_api import ModelSpec, assign_dropout_keys, sample_context
from worker_agent.runtime.model.partition import StageModule
from worker_agent.runtime.storage import checkpoint as ck


def _grads(recompute: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    build_config: Callable[..., ModelSpec] = load_entrypoint(f"{REPO}/examples/tiny_gpt.py:build_config")
    torch.manual_seed(0)
    spec = build_config(d_model=16, blocks=2, seq_len=8, dataset_size=64, vocab=16, dropout=0.3)
    assign_dropout_keys(spec.layers)
    stage = StageModule([m for _, m in spec.layers], recompute=recompute).double().train()
    x = torch.stack([torch.as_tensor(spec.dataset[i][0]) for i in range(4)])
    targets = torch.stack([spec.dataset[i][1] for i in range(4)])
    with sample_context(seed=5, step=3, sample_ids=torch.tensor([9, 2, 7, 30])):
        out = stage(x)
    # Backward runs outside the micro-batch's context, as in the pipeline schedule.
    torch.autograd.backward(spec.loss(out, targets).sum())
    return out.detach(), [p.grad.clone() for p in stage.parameters() if p.grad is not None]


def test_recomputed_layers_give_bitwise_the_same_gradients_with_dropout_on() -> None:
    out, grads = _grads(recompute=False)
    out_r, grads_r = _grads(recompute=True)
    assert torch.equal(out, out_r)
    assert len(grads) == len(grads_r) > 10
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_r, strict=True))


@pytest.mark.slow
def test_a_float64_layout_chain_with_recomputation_equals_1x1_without(tmp_path: Path) -> None:
    """Dropout is on in the test model (0.1), and the chain changes P, D and the micro-batch count."""
    root, reference = tmp_path / "recomputed", tmp_path / "reference"
    train(root, 1, 1, 2, "--activation-recomputation")
    train(root, 2, 2, 4, "--activation-recomputation")
    train(root, 3, 1, 6, "--activation-recomputation", "--schedule=gpipe")
    train(root, 1, 3, 8, "--activation-recomputation")
    train(reference, 1, 1, 8)
    diff = ck.diff(ck.resolve(reference), ck.resolve(root))
    assert diff["missing"] == [] and diff["step_a"] == diff["step_b"] == 8
    assert diff["tensors_compared"] > 20
    assert diff["max_rel"] <= 1e-9, diff
