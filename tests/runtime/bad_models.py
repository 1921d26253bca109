"""Entrypoints that return the wrong thing (used by the bad-input tests)."""

from __future__ import annotations


def returns_dict() -> dict[str, int]:
    return {"layers": 3}


def raises() -> None:
    raise RuntimeError("model construction failed")


def float32_inside() -> object:
    """The demo model with its first block's output rounded through float32 (a float64 job refuses it)."""
    import sys
    from pathlib import Path

    import torch
    from torch import nn

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from tiny_gpt import build_tiny

    class RoundsToFloat32(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.inner(x)
            return y.float().to(y.dtype)

    spec = build_tiny()
    name, block = spec.layers[1]
    spec.layers[1] = (name, RoundsToFloat32(block))
    return spec
