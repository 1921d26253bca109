"""Calibration: per-layer forward/backward time, activation sizes and memory, and loopback network costs.

Layers are timed one at a time on real samples (the input of layer ``i`` is what layers ``0..i-1``
produce), with one thread and autograd recording, as a trainer process runs them (layout-free dropout
included), on the job's device and under its precision's autocast. The last layer's time includes the
loss. On a GPU, times come from CUDA events (kernels run asynchronously) and each layer's allocator peak
over one forward and backward (``torch.cuda.max_memory_allocated`` after a reset) is recorded as well. The
network figures come from two gloo processes on this machine (point-to-point and all-reduce at a few
sizes, fitted as latency + bytes / bandwidth); there is one machine, so inter-node = intra-node.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from morphing.jobspec import Device, DType, Precision
from morphing.profile import parse_profile
from worker_agent.runtime.batch import (
    Activation,
    as_tuple,
    call_layer,
    map_tensors,
    run_layers,
    signature,
    stack_samples,
)
from worker_agent.runtime.device import compute_context, median_seconds, resolve_device, stopwatch, synchronize
from worker_agent.runtime.entrypoint import build_spec
from worker_agent.runtime.job import torch_dtype
from worker_agent.runtime.model_api import ModelSpec, assign_dropout_keys, sample_context

FORMAT = "spotmorph.profile/v1"


@dataclass(frozen=True)
class ProfileRequest:
    entrypoint: str
    micro_batch_sizes: tuple[int, ...]
    dtype: DType = "float32"
    seed: int = 0
    repeats: int = 20
    network: bool = True
    device: Device = "cpu"
    precision: Precision = "fp32"
    device_index: int | None = None


@dataclass(frozen=True)
class _Where:
    """The device layers run on and the context their forward (and the loss) runs in."""

    device: torch.device
    compute: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext

    def median_seconds(self, fn: Callable[[], Any], repeats: int) -> float:
        return median_seconds(fn, repeats, self.device)


def _saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes autograd keeps for backward while ``fn`` runs (each storage counted once)."""
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def _layer_inputs(spec: ModelSpec, m: int, dtype: torch.dtype, where: _Where) -> tuple[list[Activation], torch.Tensor]:
    """The input of every layer for a micro-batch of ``m`` samples, and the targets (on the device)."""
    samples = [spec.dataset[i % len(spec.dataset)] for i in range(m)]
    x, targets = stack_samples(samples, signature(samples[0]))
    x = map_tensors(x, lambda t: (t.to(dtype) if t.is_floating_point() else t).to(where.device))
    targets = (targets.to(dtype) if targets.is_floating_point() else targets).to(where.device)
    inputs = []
    ids = torch.arange(m, device=where.device)
    with torch.no_grad(), sample_context(0, 0, ids), where.compute():
        for _, layer in spec.layers:
            inputs.append(x)
            x = call_layer(layer, x)
    return inputs, targets


def _nbytes(x: Activation) -> int:
    return sum(t.numel() * t.element_size() for t in as_tuple(x))


class _LayerTiming:
    """Forward (with autograd recording, as in training) and backward of one layer on a fixed input."""

    def __init__(
        self,
        spec: ModelSpec,
        layer: nn.Module,
        x: Activation,
        targets: torch.Tensor,
        seed: int,
        last: bool,
        where: _Where,
    ) -> None:
        self.spec, self.layer, self.targets, self.seed, self.last = spec, layer, targets, seed, last
        self.where = where
        self.x = map_tensors(x, lambda t: t.detach().requires_grad_(t.is_floating_point()))
        self.ids = torch.arange(as_tuple(x)[0].shape[0], device=where.device)

    def forward(self) -> torch.Tensor:
        """The loss (last layer) or the layer output's differentiable tensors, flattened into one."""
        with sample_context(self.seed, 0, self.ids), self.where.compute():
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


def _scale_to_chained(
    spec: ModelSpec,
    result: list[dict[str, Any]],
    key: str,
    x: Activation,
    targets: torch.Tensor,
    request: ProfileRequest,
    where: _Where,
) -> None:
    """Scale one size's layer times so they add up to a forward + backward of the chained model.

    Layers timed alone run with warm caches and a one-layer autograd graph; chained, the same work takes
    longer (about 20% for the demo model on a CPU). The ratio is applied to every layer.
    """
    ids = torch.arange(as_tuple(x)[0].shape[0], device=where.device)

    def chained() -> None:
        with sample_context(request.seed, 0, ids), where.compute():
            loss = spec.loss(run_layers([layer for _, layer in spec.layers], x), targets).sum()
        torch.autograd.backward(loss)

    whole = where.median_seconds(chained, request.repeats)
    for _, layer in spec.layers:
        layer.zero_grad(set_to_none=True)
    parts = sum(r["forward_seconds"][key] + r["backward_seconds"][key] for r in result)
    ratio = whole / parts if parts > 0 else 1.0
    for r in result:
        r["forward_seconds"][key] *= ratio
        r["backward_seconds"][key] *= ratio


def profile_layers(spec: ModelSpec, request: ProfileRequest, where: _Where | None = None) -> list[dict[str, Any]]:
    where = where or _Where(torch.device("cpu"))
    dtype = torch_dtype(request.dtype)
    last = len(spec.layers) - 1
    result: list[dict[str, Any]] = [
        {"name": name, "forward_seconds": {}, "backward_seconds": {}} for name, _ in spec.layers
    ]
    for m in request.micro_batch_sizes:
        inputs, targets = _layer_inputs(spec, m, dtype, where)
        for i, (_, layer) in enumerate(spec.layers):
            timing = _LayerTiming(spec, layer, inputs[i], targets, request.seed, i == last, where)
            result[i]["forward_seconds"][str(m)] = where.median_seconds(timing.forward, request.repeats)
            result[i]["backward_seconds"][str(m)] = timing.backward_seconds(request.repeats)
        _scale_to_chained(spec, result, str(m), inputs[0], targets, request, where)
    m = max(request.micro_batch_sizes)
    inputs, targets = _layer_inputs(spec, m, dtype, where)
    for i, (_, layer) in enumerate(spec.layers):
        with torch.no_grad(), sample_context(request.seed, 0, torch.arange(m, device=where.device)), where.compute():
            out = call_layer(layer, inputs[i])
        timing = _LayerTiming(spec, layer, inputs[i], targets, request.seed, i == last, where)
        saved = _saved_bytes(timing.forward)
        result[i]["output_activation_bytes_per_sample"] = 0 if i == last else _nbytes(out) // m
        result[i]["parameter_bytes"] = sum(p.numel() * p.element_size() for p in layer.parameters())
        result[i]["activation_memory_bytes_per_sample"] = saved // m
        if where.device.type == "cuda":
            result[i]["peak_memory_bytes_per_sample"] = timing.peak_bytes() // m
    return result


def optimizer_bytes_ratio(spec: ModelSpec) -> float:
    """Optimizer state bytes per parameter byte, after one real step of the user's optimizer."""
    params = [(f"{n}.{p}", t) for n, layer in spec.layers for p, t in layer.named_parameters()]
    unique = list({id(t): (n, t) for n, t in params}.values())
    for _, t in unique:
        t.grad = torch.zeros_like(t)
    opt = spec.optimizer(unique)
    opt.step()
    state = sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    total = sum(t.numel() * t.element_size() for _, t in unique)
    for _, t in unique:
        t.grad = None
    return state / total if total else 0.0


def _net_worker(rank: int, port: int, sizes: list[int], repeats: int, out: Any) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    p2p, allreduce = [], []
    for size in sizes:
        buf = torch.zeros(size // 4, dtype=torch.float32)
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            times.append((time.perf_counter() - start) / 2)
        p2p.append(statistics.median(times))
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            times.append(time.perf_counter() - start)
        allreduce.append(statistics.median(times))
    if rank == 0:
        out.put((p2p, allreduce))
    dist.destroy_process_group()


def _fit(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """Least-squares ``t = latency + bytes / bandwidth``; returns (latency, bandwidth)."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(times) / n
    cov = sum((x - mx) * (y - my) for x, y in zip(sizes, times, strict=True))
    var = sum((x - mx) ** 2 for x in sizes)
    slope = max(cov / var, 1e-15)
    return max(my - slope * mx, 0.0), 1.0 / slope


def measure_network(repeats: int = 10) -> dict[str, float]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_net_worker, args=(r, port, sizes, repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    p2p, allreduce = queue.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    latency, bandwidth = _fit(sizes, p2p)
    _, allreduce_bw = _fit(sizes, allreduce)
    return {"latency": latency, "bandwidth": bandwidth, "allreduce_bandwidth": allreduce_bw}


def _device_memory(device: torch.device) -> int:
    """What one rank may use: the GPU's memory, or this machine's RAM shared by its cores."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(total // max(1, os.cpu_count() or 1))


def build_profile(request: ProfileRequest) -> dict[str, Any]:
    device = resolve_device(request.device, request.device_index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    spec = build_spec(request.entrypoint, request.seed)
    nn.ModuleList([m for _, m in spec.layers]).to(torch_dtype(request.dtype)).to(device)
    assign_dropout_keys(spec.layers)
    for _, layer in spec.layers:
        layer.train()
    layers = profile_layers(spec, request, _Where(device, compute_context(device, request.precision)))
    where = f"this GPU ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "this CPU machine"
    timing = "CUDA events per layer" if device.type == "cuda" else "1 thread per layer timing"
    if request.network:
        net = measure_network()
        source = f"measured on {where}: {timing}; loopback gloo for the network"
    else:
        net = {"latency": 5e-5, "bandwidth": 1e9, "allreduce_bandwidth": 5e8}
        source = f"measured on {where}: {timing}; network figures assumed"
    if request.precision != "fp32":
        source += f"; {request.precision} autocast"
    return {
        "format": FORMAT,
        "model": spec.name,
        "source": source,
        "dtype": request.dtype,
        **({"precision": request.precision} if request.precision != "fp32" else {}),
        "gradient_bytes_per_parameter_byte": 1.0,
        "optimizer_bytes_per_parameter_byte": optimizer_bytes_ratio(spec),
        "layers": layers,
        "cluster": {
            "gpu_memory_bytes": _device_memory(device),
            "intra_node_bandwidth_bytes_per_second": net["bandwidth"],
            "inter_node_bandwidth_bytes_per_second": net["bandwidth"],
            "allreduce_bandwidth_bytes_per_second": net["allreduce_bandwidth"],
            "intra_node_latency_seconds": net["latency"],
            "inter_node_latency_seconds": net["latency"],
            # Timed on one CPU thread: ranks beyond the cores of a node share them; a GPU is a rank's own.
            "compute_slots_per_node": None if device.type == "cuda" else os.cpu_count() or 1,
        },
    }


def write_profile(request: ProfileRequest, out: Path) -> dict[str, Any]:
    profile = build_profile(request)
    parse_profile(json.dumps(profile), "calibrated profile")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    return profile
