"""The float64 start-up check: a float64 job whose model computes anything in a lower precision is refused,
naming the module, before any rendezvous.

float64 is the exactness mode: layouts sum in different orders, which moves results by about 1e-15, and
any float32 step inside the model turns that into float32 roundings (1e-7) that training then carries on.
The check runs the whole model once on a small micro-batch (no gradients, buffers put back) with every
torch function watched, and reports the first floating-point result below float64 with the module that
produced it (the innermost one running).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from morphing.errors import UserInputError
from worker_agent.runtime.model.checks import MICRO_BATCH, buffers_kept
from worker_agent.runtime.model.model_api import ModelSpec, sample_context
from worker_agent.runtime.numerics.batch import call_layer, map_tensors, signature, stack_samples

LOWER = (torch.float32, torch.float16, torch.bfloat16)


class _Watch(TorchFunctionMode):
    def __init__(self, running: list[str]) -> None:
        super().__init__()
        self.running = running
        self.found: tuple[str, str, torch.dtype] | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.found is None:
            for value in out if isinstance(out, tuple | list) else (out,):
                if isinstance(value, torch.Tensor) and value.dtype in LOWER:
                    where = self.running[-1] if self.running else "the model"
                    self.found = (where, getattr(func, "__name__", str(func)), value.dtype)
                    break
        return out


def check_float64(spec: ModelSpec) -> None:
    """Refuse (:class:`UserInputError`) a model, already in float64, that computes below float64."""
    running: list[str] = []
    kinds: dict[str, str] = {}
    handles = []
    for layer_name, layer in spec.layers:
        for name, module in layer.named_modules():
            path = f"{layer_name}.{name}" if name else layer_name
            kinds[path] = type(module).__name__
            handles.append(module.register_forward_pre_hook(lambda _m, _a, path=path: running.append(path)))
            handles.append(module.register_forward_hook(lambda _m, _a, _o: running.pop() and None))
    m = min(MICRO_BATCH, len(spec.dataset))
    items = [spec.dataset[i] for i in range(m)]
    x, _ = stack_samples(items, signature(items[0]))
    x = map_tensors(x, lambda t: t.to(torch.float64) if t.is_floating_point() else t)
    modules: list[nn.Module] = [module for _, module in spec.layers]
    watch = _Watch(running)
    try:
        with buffers_kept(modules), torch.no_grad(), sample_context(0, 0, torch.arange(m)), watch:
            for _, layer in spec.layers:
                x = call_layer(layer, x)
    finally:
        for handle in handles:
            handle.remove()
    if watch.found is not None:
        where, op, dtype = watch.found
        raise UserInputError(
            f"dtype float64: {where} ({kinds.get(where, '?')}) computes in {str(dtype).removeprefix('torch.')} "
            f"({op}), so the result would depend on the layout by {str(dtype).removeprefix('torch.')} roundings; "
            "compute in the input's dtype there (spotmorph.hf does so for Hugging Face RMSNorm and rotary "
            "embeddings), or train in float32"
        )
