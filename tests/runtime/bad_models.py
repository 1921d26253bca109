"""Entrypoints that return the wrong thing (used by the bad-input tests)."""

from __future__ import annotations


def returns_dict() -> dict[str, int]:
    return {"layers": 3}


def raises() -> None:
    raise RuntimeError("model construction failed")


def float32_inside() -> object:
    """The demo model with its first block's output rounded through float32 (a float64 job refuses it)."""
    import dataclasses
    from pathlib import Path

    import torch
    from torch import nn

    from worker_agent.runtime.entrypoint import build_spec

    class RoundsToFloat32(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y: torch.Tensor = self.inner(x)
            return y.float().to(y.dtype)

    spec = build_spec(f"{Path(__file__).resolve().parents[2]}/examples/tiny_gpt.py:build_tiny", 0, check=False)
    layers = list(spec.layers)
    name, block = layers[1]
    layers[1] = (name, RoundsToFloat32(block))
    return dataclasses.replace(spec, layers=layers)
