"""Timing one layer on a fixed input as a trainer runs it: forward with autograd recording, backward, the
bytes autograd keeps for backward and (GPU) the allocator peak. Shared by the chained profiler and the
one-layer-at-a-time profiler of a model built on the meta device.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from worker_agent.runtime.model.model_api import ModelSpec, sample_context
from worker_agent.runtime.numerics.batch import Activation, as_tuple, call_layer, map_tensors, signature, stack_samples
from worker_agent.runtime.numerics.device import median_seconds, stopwatch, synchronize
from worker_agent.runtime.numerics.dropout import Masks


@dataclass(frozen=True)
class Where:
    """The device layers run on and the context their forward (and the loss) runs in."""

    device: torch.device
    compute: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    masks: Masks = field(default_factory=Masks, compare=False)  # dropout's caches and kernels, for every layer timed

    def median_seconds(self, fn: Callable[[], Any], repeats: int) -> float:
        return median_seconds(fn, repeats, self.device)


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes autograd keeps for backward while ``fn`` runs (each storage counted once)."""
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def nbytes(x: Activation) -> int:
    return sum(t.numel() * t.element_size() for t in as_tuple(x))


class LayerTiming:
    """Forward (with autograd recording, as in training) and backward of one layer on a fixed input."""

    def __init__(
        self,
        spec: ModelSpec,
        layer: nn.Module,
        x: Activation,
        targets: torch.Tensor,
        seed: int,
        last: bool,
        where: Where,
    ) -> None:
        self.spec, self.layer, self.targets, self.seed, self.last = spec, layer, targets, seed, last
        self.where = where
        self.x = map_tensors(x, lambda t: t.detach().requires_grad_(t.is_floating_point()))
        self.ids = torch.arange(as_tuple(x)[0].shape[0], device=where.device)

    def forward(self) -> torch.Tensor:
        """The loss (last layer) or the layer output's differentiable tensors, flattened into one."""
        with sample_context(self.seed, 0, self.ids, self.where.masks), self.where.compute():
            out = call_layer(self.layer, self.x)
            if self.last:
                return self.spec.loss(out, self.targets).sum()
        grads = [t for t in as_tuple(out) if t.requires_grad]
        if len(grads) == 1:
            return grads[0]
        return torch.cat([t.reshape(-1) for t in grads]) if grads else torch.zeros(1, requires_grad=True)

    def backward_seconds(self, repeats: int) -> float:
        times = []
        for _ in range(repeats + 1):
            out = self.forward()
            with stopwatch(self.where.device) as elapsed:
                torch.autograd.backward(out, torch.ones_like(out))
            times.append(elapsed())
        self.layer.zero_grad(set_to_none=True)
        return max(statistics.median(times[1:]), 1e-9)

    def peak_bytes(self) -> int:
        """Allocator peak of one forward and backward above what was allocated before, less the parameter
        gradients (the planner counts those with the parameters); GPU only."""
        device = self.where.device
        self.layer.zero_grad(set_to_none=True)
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = self.forward()
        torch.autograd.backward(out, torch.ones_like(out))
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        grads = sum(p.grad.numel() * p.grad.element_size() for p in self.layer.parameters() if p.grad is not None)
        self.layer.zero_grad(set_to_none=True)
        return max(0, peak - grads)


def first_input(spec: ModelSpec, m: int, dtype: torch.dtype, where: Where) -> tuple[Activation, torch.Tensor]:
    """The first layer's input for a micro-batch of ``m`` samples, and the targets (on the device)."""
    samples = [spec.dataset[i % len(spec.dataset)] for i in range(m)]
    x, targets = stack_samples(samples, signature(samples[0]))
    x = map_tensors(x, lambda t: (t.to(dtype) if t.is_floating_point() else t).to(where.device))
    targets = (targets.to(dtype) if targets.is_floating_point() else targets).to(where.device)
    return x, targets
