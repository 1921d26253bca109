"""What flows between layers and how a micro-batch's loss is weighed: shared by the engine, the start-up
checks and the profiler, so all three treat tuples, padding and token counts the same way.

An activation is one tensor or a tuple of tensors, each with the sample dimension first (that is what
lets the runtime cut a batch into micro-batches of any size). A tuple a layer returns is unpacked into
the next layer's positional arguments, inside a stage exactly as the pipeline does between stages,
so where the pipeline is cut does not matter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from morphing.errors import UserInputError

Activation = torch.Tensor | tuple[torch.Tensor, ...]
IGNORE_INDEX = -100  # target value that takes no part in a token-normalised loss (as in Hugging Face)
NORMALIZATIONS = ("sample", "token")


def as_tuple(x: Activation) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def call_layer(layer: nn.Module, x: Activation) -> Any:
    """``layer(*x)`` for a tuple, ``layer(x)`` for a tensor."""
    return layer(*x) if isinstance(x, tuple) else layer(x)


def run_layers(layers: Sequence[nn.Module], x: Activation) -> Any:
    out: Any = x
    for layer in layers:
        out = call_layer(layer, out)
    return out


def map_tensors(x: Activation, fn: Callable[[torch.Tensor], torch.Tensor]) -> Activation:
    return tuple(fn(t) for t in x) if isinstance(x, tuple) else fn(x)


def describe(x: object) -> str:
    """Shapes and dtypes of an activation (or what it is instead), for messages."""
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    if isinstance(x, tuple):
        return "(" + ", ".join(describe(t) for t in x) + ")"
    return type(x).__name__


def signature(item: tuple[Activation, torch.Tensor]) -> str:
    """What every dataset item must share with every other: shapes and dtypes of input and target."""
    return f"input {describe(item[0])}, target {describe(item[1])}"


def stack_samples(samples: Sequence[tuple[Activation, torch.Tensor]], expected: str) -> tuple[Activation, torch.Tensor]:
    """One micro-batch from dataset items; an item whose shapes differ from ``expected`` is bad input."""
    for item in samples:
        if signature(item) != expected:
            raise UserInputError(
                f"dataset items have varying shapes: expected {expected}, got {signature(item)}; every item must "
                "have the same shapes, because the runtime stacks items into micro-batches of any size"
            )
    parts = [as_tuple(s[0]) for s in samples]
    stacked = tuple(torch.stack([p[i] for p in parts]) for i in range(len(parts[0])))
    inputs: Activation = stacked if isinstance(samples[0][0], tuple) else stacked[0]
    return inputs, torch.stack([s[1] for s in samples])


def count_target_tokens(dataset: Any, indices: Sequence[int]) -> int:
    """Targets that are not ``IGNORE_INDEX`` over ``indices``: the token-mode denominator of a step.

    A dataset may answer faster itself (``TokenFileDataset`` has no ignored targets); otherwise the
    targets are read. It depends only on the step's indices, so every layout divides by the same count.
    """
    fast = getattr(dataset, "count_target_tokens", None)
    if callable(fast):
        return int(fast(indices))
    return sum(int((dataset[i][1] != IGNORE_INDEX).sum()) for i in indices)


def weighted_loss(
    per_item: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, normalization: str, denominator: float
) -> torch.Tensor:
    """``sum(weight * loss) / denominator``; in token mode ignored targets count zero and each sample's
    weight (0 for padding) applies to all its tokens."""
    if normalization == "token":
        per_item = torch.where(targets != IGNORE_INDEX, per_item, torch.zeros_like(per_item))
    weights = weights.reshape(-1, *([1] * (per_item.dim() - 1)))
    return (per_item * weights).sum() / denominator


def check_loss_shape(per_item: object, targets: torch.Tensor, normalization: str) -> str | None:
    """Why a loss output does not fit the normalisation, or None when it does."""
    if not isinstance(per_item, torch.Tensor):
        return f"the loss returned {type(per_item).__name__}, not a tensor"
    if normalization == "token":
        if per_item.shape != targets.shape:
            return (
                f"with loss_normalization='token' the loss must return one value per target token, shape "
                f"{list(targets.shape)} (ignored targets {IGNORE_INDEX} may hold anything), got "
                f"{list(per_item.shape)}"
            )
        return None
    if per_item.shape != targets.shape[:1]:
        return (
            f"the loss must return one value per sample, shape [{targets.shape[0]}], got {list(per_item.shape)}: "
            "the runtime weighs each sample (padding weighs 0) and divides by the global batch, so a loss "
            "averaged over the micro-batch would change with the layout"
        )
    return None
