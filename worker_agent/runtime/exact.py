"""Exact mode: gradients summed in integers, so the layout changes no bit of the result.

A float sum depends on its order, and the order is the layout's: which micro-batches a replica holds,
how stages cut tied layers, how an all-reduce associates. Exact mode fixes the unit of gradient work
(one micro-batch of ``micro_batch_size`` samples at fixed indices of the step, whatever the layout) and
sums units exactly: after each micro-batch's backward, every gradient the stage's tensors received is
split into three 40-bit fixed-point limbs (bits 2^0..2^39, 2^-40..2^-1, 2^-80..2^-41; anything below
2^-80 dropped, the same way everywhere) held in int64, which add without error in any order, over
micro-batches, tied copies and replicas alike. Only then is each sum made a float again, by one fixed
formula. A gradient of 2^40 or more (or not finite) cannot be held and fails the step as the user's
error. A limb holds 2^23 additions before an int64 could overflow: a step of more than 2^20 micro-batches
is refused.

Clipping takes each gradient's sum of squares where it lives (the same tensor in every layout, so the
same number) and adds them with ``math.fsum`` in the model's order, after an all-reduce in which each
entry has one contributor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from morphing.errors import UserInputError

LIMB = 2.0**40
MAX_UNITS = 1 << 20  # micro-batches a step; with up to 8 uses of a tied parameter, 2^23 additions of < 2^40


def limbs(grad: torch.Tensor, name: str) -> torch.Tensor:
    """``grad`` as int64 limbs ``[3, *shape]``: whole part, then two 40-bit fractions (each step exact)."""
    x = grad.detach().to(torch.float64)
    if not bool(torch.isfinite(x).all()) or bool((x.abs() >= LIMB).any()):
        worst = float(x.abs().nan_to_num(nan=math.inf).max())
        raise UserInputError(
            f"exact mode: a gradient of {name} is {worst:g}, which its fixed point cannot hold (finite and below "
            "2^40); lower the learning rate or the loss's scale, or train without exact"
        )
    whole = torch.trunc(x)
    high = (x - whole) * LIMB
    first = torch.trunc(high)
    second = torch.trunc((high - first) * LIMB)
    return torch.stack([whole, first, second]).to(torch.int64)


def to_float(summed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The value of summed limbs by one fixed formula: the same integers give the same bits everywhere."""
    parts = summed.to(torch.float64)
    return ((parts[2] / LIMB + parts[1]) / LIMB + parts[0]).to(dtype)


class ExactGradients:
    """The integer sums of one stage's gradients over a step's micro-batches (see the module docstring)."""

    def __init__(self, leaves: Sequence[tuple[str, torch.Tensor]], units: int) -> None:
        if units > MAX_UNITS:
            raise UserInputError(f"exact mode sums at most {MAX_UNITS} micro-batches a step; this one has {units}")
        self.leaves = list(leaves)
        self.sums: dict[str, torch.Tensor] = {}

    def take(self) -> None:
        """After a micro-batch's backward: move every gradient into the sums (and off the tensors)."""
        for name, leaf in self.leaves:
            if leaf.grad is None:
                continue
            part = limbs(leaf.grad, name)
            held = self.sums.get(name)
            self.sums[name] = part if held is None else held.add_(part)
            leaf.grad = None

    def finish(
        self,
        params: Sequence[tuple[str, torch.Tensor]],
        data_parallel: dist.ProcessGroup | None,
        tied: dict[str, dist.ProcessGroup],
    ) -> None:
        """Sum over replicas and tied copies in integers, then give each parameter its float gradient."""
        for name, param in params:
            if name not in self.sums:
                self.sums[name] = torch.zeros((3, *param.shape), dtype=torch.int64, device=param.device)
        plain = [self.sums[n] for n, _ in params if n not in tied]
        if data_parallel is not None and plain:
            flat = torch.cat([s.reshape(-1) for s in plain])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=data_parallel)
            offset = 0
            for summed in plain:
                summed.copy_(flat[offset : offset + summed.numel()].view_as(summed))
                offset += summed.numel()
        for name, param in params:
            group = tied.get(name)
            if group is not None:
                dist.all_reduce(self.sums[name], op=dist.ReduceOp.SUM, group=group)
            param.grad = to_float(self.sums[name], param.dtype)
        self.sums = {}


def clip_coefficient(
    squares: dict[str, float], order: Sequence[str], pipeline: dist.ProcessGroup | None, max_norm: float
) -> float:
    """The clipping factor from each owned gradient's sum of squares, the same bits in every layout."""
    vector = torch.tensor([squares.get(name, 0.0) for name in order], dtype=torch.float64)
    if pipeline is not None:
        dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=pipeline)  # one contributor per entry: exact
    return max_norm / (math.sqrt(math.fsum(vector.tolist())) + 1e-6)
