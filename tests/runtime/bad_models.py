"""Entrypoints that return the wrong thing (used by the bad-input tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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

    from worker_agent.runtime.model.entrypoint import build_spec

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


def parameter_set_by_hand() -> object:
    """The demo model with a parameter put in a module's table by hand: it cannot be kept off the device."""
    import torch
    from torch import nn

    from worker_agent.runtime.model.entrypoint import load_entrypoint

    spec: Any = load_entrypoint(f"{Path(__file__).parents[2]}/examples/tiny_gpt.py:build_tiny")()
    spec.layers[0][1]._parameters["extra"] = nn.Parameter(torch.zeros(3))
    return spec
