"""Tuples between layers, the loss weighting of padded micro-batches, and the public ``spotmorph`` names."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.runtime.helpers import REPO
from worker_agent.runtime.model.partition import StageModule
from worker_agent.runtime.numerics.batch import check_loss_shape, run_layers, weighted_loss


class Split(nn.Module):
    """Returns (hidden, mask): a tensor that rides along for later layers."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, (x > 0).to(x.dtype)


class Masked(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * mask + 1, mask


class Join(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x - mask


def test_a_stage_chains_tuples_as_the_pipeline_does_between_stages() -> None:
    layers = [("split", Split()), ("masked", Masked()), ("join", Join())]
    x = torch.randn(3, 5)
    whole = run_layers([m for _, m in layers], x)
    for cut in (1, 2):
        first = StageModule([m for _, m in layers[:cut]])(x)
        assert isinstance(first, tuple)
        assert torch.equal(StageModule([m for _, m in layers[cut:]])(*first), whole)


def test_padding_weighs_nothing_and_ignored_targets_count_zero() -> None:
    per_token = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]])
    targets = torch.tensor([[5, -100, 7], [1, 2, 3]])
    loss = weighted_loss(per_token, targets, torch.tensor([1.0, 0.0]), "token", 2.0)
    assert float(loss) == (1.0 + 4.0) / 2
    per_sample = torch.tensor([3.0, 5.0])
    assert float(weighted_loss(per_sample, targets, torch.tensor([1.0, 0.0]), "sample", 4.0)) == 3.0 / 4


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 9),
    replicas=st.integers(1, 4),
    micro=st.integers(1, 4),
    mode=st.sampled_from(["sample", "token"]),
    seed=st.integers(0, 10**6),
)
def test_any_cut_into_padded_micro_batches_sums_to_the_global_mean(
    batch: int, replicas: int, micro: int, mode: str, seed: int
) -> None:
    """The engine's invariant in miniature: the loss of the whole batch does not depend on the cut."""
    from morphing.layout import make_layout

    replicas = min(replicas, batch)
    gen = torch.Generator().manual_seed(seed)
    per_token = torch.rand(batch, 5, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 7, (batch, 5), generator=gen)
    targets[torch.rand(batch, 5, generator=gen) < 0.3] = -100
    per_item = per_token if mode == "token" else per_token.sum(dim=1)
    valid = torch.where(targets != -100, per_token, 0.0)
    expected = valid.sum() / max(1, int((targets != -100).sum())) if mode == "token" else per_token.sum() / batch
    denominator = max(1, int((targets != -100).sum())) if mode == "token" else batch
    layout = make_layout(
        num_layers=1, pipeline_stages=1, data_parallel=replicas, micro_batch_size=micro, global_batch=batch
    )
    total = torch.zeros((), dtype=torch.float64)
    for replica in range(replicas):
        lo, hi = layout.replica_slice(replica)
        rows = list(range(lo, hi))
        padded = rows + [rows[0]] * (-len(rows) % micro)
        weights = torch.tensor([1.0] * len(rows) + [0.0] * (len(padded) - len(rows)), dtype=torch.float64)
        for start in range(0, len(padded), micro):
            part = padded[start : start + micro]
            total += weighted_loss(per_item[part], targets[part], weights[start : start + micro], mode, denominator)
    assert float(total) == pytest.approx(float(expected), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("shape", "mode", "ok"),
    [
        ([2], "sample", True),
        ([], "sample", False),
        ([2, 3], "sample", False),
        ([2, 3], "token", True),
        ([2], "token", False),
    ],
)
def test_the_loss_shape_follows_the_normalisation(shape: list[int], mode: str, ok: bool) -> None:
    assert (check_loss_shape(torch.zeros(shape), torch.zeros(2, 3, dtype=torch.long), mode) is None) == ok


def test_the_public_names_load_lazily() -> None:
    code = (
        "import sys, spotmorph\n"
        "assert 'torch' not in sys.modules\n"
        "from spotmorph import ModelSpec, Dropout\n"
        "from spotmorph.data import TokenFileDataset\n"
        "from worker_agent.runtime.model.model_api import ModelSpec as Inner\n"
        "assert ModelSpec is Inner and 'transformers' not in sys.modules\n"
        "from spotmorph.hf import causal_lm_spec\n"
        "assert 'transformers' not in sys.modules, 'transformers is imported only when a model is adapted'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
