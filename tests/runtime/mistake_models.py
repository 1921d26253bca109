"""Entrypoints that each break one rule of the model API (used by test_startup_checks.py).

Every one of them would train in some layout, or fail in one layout and train in another, or train
differently after a resume; the start-up checks refuse them with exit 2 instead.
"""

from __future__ import annotations

import torch
from torch import nn

from worker_agent.runtime.model.model_api import ModelSpec


class Pairs:
    def __init__(self, size: int = 32, width: int = 4) -> None:
        self.size, self.width = size, width

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.linspace(0, 1, self.width) * (i + 1) / self.size
        return x, x.sum(dim=0, keepdim=True)


class Ragged(Pairs):
    """Sample length grows with the index: fine with one sample per micro-batch, fatal with two."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.ones(2 + i % 3)
        return x, x.sum(dim=0, keepdim=True)


class TokenTargets(Pairs):
    """Integer targets, one per position: what token mode expects a per-token loss for."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, _ = super().__getitem__(i)
        return x, torch.arange(self.width) % 2


class WithNone(nn.Module):
    """Returns (hidden, None), as a Hugging Face block with an optional output does."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.lin(x), None


class FunctionalDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.lin(x), 0.1, self.training)


def per_sample(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((pred - target) ** 2).sum(dim=1)


def _spec(first: nn.Module, *, loss: object = per_sample, dataset: object = None, **kwargs: object) -> ModelSpec:
    return ModelSpec(
        layers=[("first", first), ("out", nn.Linear(4, 1))],
        loss=loss,  # type: ignore[arg-type]
        dataset=dataset or Pairs(),  # type: ignore[arg-type]
        optimizer=lambda params: torch.optim.SGD([p for _, p in params], lr=0.1),
        lr_schedule=lambda step: 0.1,
        **kwargs,  # type: ignore[arg-type]
    )


def good() -> ModelSpec:
    """Plain torch.nn.Dropout is fine: the runtime replaces it by the layout-free one."""
    return _spec(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))


def tuple_with_none() -> ModelSpec:
    return _spec(WithNone())


def scalar_loss() -> ModelSpec:
    return _spec(nn.Linear(4, 4), loss=lambda pred, target: ((pred - target) ** 2).mean())


def per_sample_loss_in_token_mode() -> ModelSpec:
    return _spec(nn.Linear(4, 4), loss_normalization="token", dataset=TokenTargets())


def varying_shapes() -> ModelSpec:
    return ModelSpec(
        layers=[("first", nn.Identity()), ("out", nn.Identity())],
        loss=lambda pred, target: pred.sum(dim=1, keepdim=True) - target,
        dataset=Ragged(),
        optimizer=lambda params: torch.optim.SGD([p for _, p in params] or [nn.Parameter(torch.zeros(1))], lr=0.1),
        lr_schedule=lambda step: 0.1,
    )


def global_rng_dropout() -> ModelSpec:
    return _spec(FunctionalDropout())


def channel_dropout() -> ModelSpec:
    return _spec(nn.Sequential(nn.Linear(4, 4), nn.Dropout1d(0.2)))


def mixes_samples() -> ModelSpec:
    return _spec(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))


def loss_mixes_samples() -> ModelSpec:
    return _spec(
        nn.Linear(4, 4), loss=lambda pred, target: ((pred - target) ** 2).sum(dim=1) - ((pred - target) ** 2).mean()
    )
