"""A stage's tensors around the step: loaded optimizer state placed by its parameter, coalesced all-reduces,
the gradients' norm and scaling on the device (fused per dtype, no wait for the host)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def placed_state(
    optimizer: torch.optim.Optimizer, param: torch.Tensor, state: dict[str, Any], copy: bool = True
) -> dict[str, Any]:
    """Loaded optimizer state moved next to its parameter, as ``Optimizer.load_state_dict`` places it:
    floating-point state in the parameter's device and dtype; a scalar ``step`` stays on the CPU unless the
    param group is fused or capturable. ``copy`` False: a tensor already in place is taken as it is."""
    group = next((g for g in optimizer.param_groups if any(p is param for p in g["params"])), {})
    on_device = bool(group.get("fused") or group.get("capturable"))
    out: dict[str, Any] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            out[key] = value
        elif key == "step":
            out[key] = value.to(param.device, copy=True) if on_device else value.detach().clone()
        elif value.is_floating_point():
            out[key] = value.to(device=param.device, dtype=param.dtype, copy=copy)
        else:
            out[key] = value.to(device=param.device, copy=copy)
    return out


def state_of(take: Callable[[str, torch.Tensor], torch.Tensor], name: str, state: dict[str, Any]) -> dict[str, Any]:
    return {k: take(f"{name}/{k}", v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def all_reduce_coalesced(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """One SUM all-reduce over a flat copy of ``grads`` (many tiny all-reduces cost latency each)."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def squared_norm(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of squares of ``grads`` in float64, on ``device``, one fused norm per dtype (no float64
    copies of the gradients)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for group in by_dtype(grads).values():
        norms = torch._foreach_norm(group, 2, dtype=torch.float64)
        total = total + torch.stack(norms).pow(2).sum()
    return total


HALF = (torch.bfloat16, torch.float16)  # multiplied in float32, as a Python float scalar is


def scale_in_place(grads: list[torch.Tensor], coef: torch.Tensor) -> None:
    """``grad *= coef`` for every gradient, ``coef`` a device scalar (in the arithmetic a Python float would be)."""
    for dtype, group in by_dtype(grads).items():
        torch._foreach_mul_(group, coef.to(torch.float32 if dtype in HALF else dtype))


def by_dtype(tensors: list[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor.detach())
    return groups
