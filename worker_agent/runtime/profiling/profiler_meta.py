"""Calibrating a model larger than the device: built on the meta device, its layers made real one at a time.

``spotmorph profile --from-config`` never holds more than one layer's parameters (and, while it is timed,
that layer's activations and gradients): parameter bytes come from the shapes, the bytes autograd keeps
and each layer's output from a real forward of that layer, and the times as in the chained profiler.
The input of layer ``i`` is what the real layers ``0..i-1`` produced from the same samples, so each
layer runs on what it would see in training (values of freshly initialised weights). What this path
cannot do is the chained profiler's scaling of the layer times to one forward and backward of the whole
model (that needs the whole model at once); the profile's ``source`` says so.
"""

from __future__ import annotations

from typing import Any

import torch

from worker_agent.runtime.model.meta_build import materialized
from worker_agent.runtime.model.model_api import ModelSpec, sample_context
from worker_agent.runtime.numerics.batch import call_layer
from worker_agent.runtime.profiling.layer_timing import LayerTiming, Where, first_input, nbytes, saved_bytes
from worker_agent.runtime.profiling.profile_progress import Progress


def profile_layers_one_at_a_time(
    spec: ModelSpec,
    sizes: tuple[int, ...],
    seed: int,
    repeats: int,
    where: Where,
    dtype: torch.dtype,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """The profile's layer records of a spec whose parameters are on the meta device (in ``dtype``)."""
    progress = progress or Progress(len(spec.layers), sizes)
    inputs = {m: first_input(spec, m, dtype, where) for m in sizes}
    biggest, last = max(sizes), len(spec.layers) - 1
    result: list[dict[str, Any]] = []
    for i, (name, layer) in enumerate(spec.layers):
        record: dict[str, Any] = {
            "name": name,
            "forward_seconds": {},
            "backward_seconds": {},
            "parameter_bytes": sum(p.numel() * p.element_size() for p in layer.parameters()),
        }
        with materialized(layer, where.device, seed + i):
            for m in sizes:
                progress.measuring(i, name, m)
                x, targets = inputs[m]
                timing = LayerTiming(spec, layer, x, targets, seed, i == last, where)
                record["forward_seconds"][str(m)] = where.median_seconds(timing.forward, repeats)
                record["backward_seconds"][str(m)] = timing.backward_seconds(repeats)
                if m == biggest:
                    record["activation_memory_bytes_per_sample"] = saved_bytes(timing.forward) // m
                    if where.device.type == "cuda":
                        record["peak_memory_bytes_per_sample"] = timing.peak_bytes() // m
                if i < last:
                    ids = torch.arange(m, device=where.device)
                    with torch.no_grad(), sample_context(seed, 0, ids, where.masks), where.compute():
                        out = call_layer(layer, x)
                    inputs[m] = (out, targets)
                    if m == biggest:
                        record["output_activation_bytes_per_sample"] = nbytes(out) // m
        record.setdefault("output_activation_bytes_per_sample", 0)
        result.append(record)
    return result
