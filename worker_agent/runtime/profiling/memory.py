"""Measured peak memory of each pipeline stage, to check the planner's memory model on a GPU.

A stage's peak under a schedule is its parameters, gradients and optimizer state, the activations of the
micro-batches it holds in flight (``morphing.stages.in_flight``: 1F1B runs that many forwards before the
first backward), and the transient memory of the backward that runs then. One GPU measures any layout:
each stage is replayed alone, its in-flight forwards first, then their backwards and an optimizer step,
and the allocator's peak above what was allocated before the stage is its figure. Communication buffers
and the CUDA context are not in it (nor in the planner's model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from morphing.errors import UserInputError
from morphing.jobspec import Precision, Schedule
from morphing.layout import Layout
from morphing.stages import in_flight
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.model_api import assign_dropout_keys, dropout_dtypes, sample_context
from worker_agent.runtime.model.partition import PartitionedModel
from worker_agent.runtime.numerics.batch import Activation, as_tuple, map_tensors, signature, stack_samples
from worker_agent.runtime.numerics.device import autocast_dtype, compute_context, synchronize
from worker_agent.runtime.numerics.dropout import Masks
from worker_agent.runtime.numerics.dropout import warm_up as warm_up_dropout


@dataclass(frozen=True)
class StageMemoryRequest:
    entrypoint: str
    layout: Layout
    schedule: Schedule = "1f1b"
    precision: Precision = "fp32"
    recomputation: bool = False
    seed: int = 0


def measure_stage_peaks(request: StageMemoryRequest, device: torch.device) -> list[int]:
    """Peak allocated bytes of every stage of ``request.layout`` (replica 0), measured on ``device``."""
    if device.type != "cuda":
        raise UserInputError("measuring stage memory needs a CUDA device (the allocator's peak statistics)")
    torch.cuda.set_device(device)
    spec = build_spec(request.entrypoint, request.seed)
    assign_dropout_keys(spec.layers)
    # As a trainer does before its first step: the fused kernel compiled lazily inside a recomputation fails.
    masks = Masks()  # what dropout keeps from one call to the next, the compiled kernel included
    warm_up_dropout(device, dropout_dtypes(spec, torch.float32, autocast_dtype(request.precision)), masks)
    model = PartitionedModel(spec)
    model.check_layout(request.layout)
    layout, m = request.layout, request.layout.micro_batch_size
    compute = compute_context(device, request.precision)
    samples = [spec.dataset[i % len(spec.dataset)] for i in range(m)]
    x, targets = stack_samples(samples, signature(samples[0]))
    ids = torch.arange(m, device=device)
    x = map_tensors(x, lambda t: t.to(device))
    targets = targets.to(device)
    peaks = []
    for stage in range(layout.pipeline_stages):
        is_last = stage == layout.pipeline_stages - 1
        held = in_flight(request.schedule, stage, layout.pipeline_stages, layout.max_micro_batches)
        module = model.stage_module(layout, stage, request.recomputation, compute).train()
        synchronize(device)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
        module.to(device)
        params = model.stage_params(layout, stage)
        optimizer = spec.optimizer(params)
        for _, param in params:  # a step in: the optimizer state exists while the next step runs
            param.grad = torch.zeros_like(param)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        outputs = []
        for _ in range(held):
            with sample_context(request.seed, 0, ids, masks):
                out = module(*as_tuple(x))
            if is_last:
                with compute():
                    out = spec.loss(out, targets).sum()
            outputs.append(out)
        for out in outputs:
            tensors = [t for t in as_tuple(out) if t.requires_grad]
            torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])
        del outputs
        optimizer.step()
        synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - before)
        optimizer.zero_grad(set_to_none=True)
        del optimizer
        x = _next_input(module, x, ids, request.seed, masks)
        module.to("cpu")
    return peaks


def _next_input(module: nn.Module, x: Activation, ids: torch.Tensor, seed: int, masks: Masks) -> Activation:
    """What the next stage receives: this stage's output for the same micro-batch, as a fresh leaf that
    requires grad when it is floating point (the runtime's received activations do: their gradient is sent
    back), so the stage's backward computes, and the peak counts, the input gradient too."""
    with torch.no_grad(), sample_context(seed, 0, ids, masks):
        out = module(*as_tuple(x))
    return map_tensors(out, lambda t: t.detach().requires_grad_(t.is_floating_point()))
