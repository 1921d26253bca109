"""Exact mode: gradients summed in integers, so the layout changes no bit of the result.

A float sum depends on its order, and the order is the layout's: which micro-batches a replica holds,
how stages cut tied layers, how an all-reduce associates. Exact mode fixes the unit of gradient work
(one micro-batch of ``micro_batch_size`` samples at fixed indices of the step, whatever the layout) and
sums units exactly: after each micro-batch's backward, every gradient the stage's tensors received is
split into three 40-bit fixed-point limbs (bits 2^0..2^39, 2^-40..2^-1, 2^-80..2^-41; anything below
2^-80 dropped, the same way everywhere). Each limb is an integer below 2^40 held in a float64, and
integers add exactly in float64 up to 2^53, so limbs add without error in any order, over micro-batches,
tied copies and replicas alike (an all-reduce of float64 integers is exact on gloo and NCCL), for up to
2^13 additions a step. Only then is each sum made a float again, by one fixed formula. A gradient of 2^40
or more (or not finite) cannot be held and fails the step as the user's error.

Clipping takes each gradient's sum of squares where it lives (the same tensor in every layout, so the
same number) and adds them with ``math.fsum`` in the model's order, after an all-reduce in which each
entry has one contributor.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from morphing.errors import UserInputError

LIMB = 2.0**40
MAX_ADDITIONS = 1 << 13  # integers below 2^40 add exactly in float64 this many times (2^53)


def add_limbs(sums: torch.Tensor, grad: torch.Tensor, name: str) -> None:
    """Add ``grad``'s limbs to ``sums`` (float64 ``[3, *shape]``): whole part, then two 40-bit fractions.

    Every step is exact: the whole part is cut off, the rest scaled by a power of two, in float64, in place
    (one copy of the gradient, one scratch tensor)."""
    x = grad.detach().to(torch.float64, copy=True)
    low, high = torch.aminmax(x)
    if not -LIMB < float(low) <= float(high) < LIMB:  # NaN fails both comparisons
        worst = max(abs(float(low)), abs(float(high))) if math.isfinite(float(low) + float(high)) else math.nan
        raise UserInputError(
            f"exact mode: a gradient of {name} is {worst:g}, which its fixed point cannot hold (finite and below "
            "2^40); lower the learning rate or the loss's scale, or train without exact"
        )
    part = torch.trunc(x)
    sums[0].add_(part)
    x.sub_(part).mul_(LIMB)
    torch.trunc(x, out=part)
    sums[1].add_(part)
    x.sub_(part).mul_(LIMB)
    torch.trunc(x, out=part)
    sums[2].add_(part)


def limbs(grad: torch.Tensor, name: str) -> torch.Tensor:
    """``grad`` alone as limbs ``[3, *shape]`` (float64 integers)."""
    sums = torch.zeros((3, *grad.shape), dtype=torch.float64, device=grad.device)
    add_limbs(sums, grad, name)
    return sums


def to_float(summed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The value of summed limbs by one fixed formula: the same integers give the same bits everywhere."""
    parts = summed.to(torch.float64)
    return ((parts[2] / LIMB + parts[1]) / LIMB + parts[0]).to(dtype)


class ExactGradients:
    """The integer sums of one stage's gradients over a step's micro-batches (see the module docstring)."""

    def __init__(self, leaves: Sequence[tuple[str, torch.Tensor]], units: int, uses: int = 1) -> None:
        """``units``: the step's micro-batches (all replicas'); ``uses``: the most layers one parameter is in."""
        if units * uses > MAX_ADDITIONS:
            raise UserInputError(
                f"exact mode adds at most {MAX_ADDITIONS} gradients of a parameter a step; {units} micro-batches of "
                f"a parameter used by {uses} layers are more: raise micro_batch_size"
            )
        self.leaves = list(leaves)
        self.sums: dict[str, torch.Tensor] = {}

    def take(self) -> None:
        """After a micro-batch's backward: move every gradient into the sums (and off the tensors)."""
        for name, leaf in self.leaves:
            if leaf.grad is None:
                continue
            sums = self.sums.get(name)
            if sums is None:
                sums = self.sums[name] = torch.zeros((3, *leaf.shape), dtype=torch.float64, device=leaf.device)
            add_limbs(sums, leaf.grad, name)
            leaf.grad = None

    def finish(
        self,
        params: Sequence[tuple[str, torch.Tensor]],
        data_parallel: dist.ProcessGroup | None,
        tied: dict[str, dist.ProcessGroup],
    ) -> None:
        """Sum over replicas and tied copies (integers in float64: exact), then give each its float gradient."""
        for name, param in params:
            if name not in self.sums:
                self.sums[name] = torch.zeros((3, *param.shape), dtype=torch.float64, device=param.device)
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
    squares: dict[str, float],
    order: Sequence[str],
    pipeline: dist.ProcessGroup | None,
    max_norm: float,
    device: torch.device | None = None,
) -> float:
    """The clipping factor from each owned gradient's sum of squares, the same bits in every layout
    (``device``: where the pipeline group's backend takes tensors, the GPU under NCCL)."""
    vector = torch.tensor([squares.get(name, 0.0) for name in order], dtype=torch.float64, device=device)
    if pipeline is not None:
        dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=pipeline)  # one contributor per entry: exact
    return max_norm / (math.sqrt(math.fsum(vector.tolist())) + 1e-6)


# torch's words when an op has no deterministic kernel under ``torch.use_deterministic_algorithms(True)``.
_NO_DETERMINISTIC = re.compile(r"^(?P<op>\S+) does not have a deterministic implementation")


@contextlib.contextmanager
def deterministic_or_refused() -> Iterator[None]:
    """Exact mode's promise on a GPU: every kernel is deterministic, or the job is refused as the user's
    error naming the op that is not (torch raises when it meets one), instead of a crash and a retry."""
    try:
        yield
    except RuntimeError as exc:
        found = _NO_DETERMINISTIC.match(str(exc).strip())
        if found is None:
            raise
        raise UserInputError(
            f"exact mode: {found['op']} has no deterministic kernel on this device, so the job's bits would "
            "depend on the run; train this model without exact mode (exact: false, no --exact), or replace "
            "that op in the model"
        ) from exc
