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

import json
import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from morphing.jobspec import Device, DType, Precision
from morphing.profile import parse_profile
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.meta_build import build_spec_on_meta
from worker_agent.runtime.model.model_api import ModelSpec, assign_dropout_keys, sample_context
from worker_agent.runtime.numerics.batch import (
    Activation,
    as_tuple,
    call_layer,
    run_layers,
)
from worker_agent.runtime.numerics.device import compute_context, resolve_device
from worker_agent.runtime.numerics.job import torch_dtype
from worker_agent.runtime.profiling.layer_timing import LayerTiming, Where, first_input, nbytes, saved_bytes
from worker_agent.runtime.profiling.profile_progress import Progress, duration
from worker_agent.runtime.profiling.profiler_meta import profile_layers_one_at_a_time

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
    # Build the model on the meta device and time its layers one at a time (a model larger than the device).
    from_config: bool = False


def _layer_inputs(spec: ModelSpec, m: int, dtype: torch.dtype, where: Where) -> tuple[list[Activation], torch.Tensor]:
    """The input of every layer for a micro-batch of ``m`` samples, and the targets (on the device)."""
    x, targets = first_input(spec, m, dtype, where)
    inputs = []
    ids = torch.arange(m, device=where.device)
    with torch.no_grad(), sample_context(0, 0, ids, where.masks), where.compute():
        for _, layer in spec.layers:
            inputs.append(x)
            x = call_layer(layer, x)
    return inputs, targets


def _scale_to_chained(
    spec: ModelSpec,
    result: list[dict[str, Any]],
    key: str,
    x: Activation,
    targets: torch.Tensor,
    request: ProfileRequest,
    where: Where,
) -> None:
    """Scale one size's layer times so they add up to a forward + backward of the chained model.

    Layers timed alone run with warm caches and a one-layer autograd graph; chained, the same work takes
    longer (about 20% for the demo model on a CPU). The ratio is applied to every layer.
    """
    ids = torch.arange(as_tuple(x)[0].shape[0], device=where.device)

    def chained() -> None:
        with sample_context(request.seed, 0, ids, where.masks), where.compute():
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


def profile_layers(
    spec: ModelSpec, request: ProfileRequest, where: Where | None = None, progress: Progress | None = None
) -> list[dict[str, Any]]:
    where = where or Where(torch.device("cpu"))
    progress = progress or Progress(len(spec.layers), request.micro_batch_sizes)
    dtype = torch_dtype(request.dtype)
    last = len(spec.layers) - 1
    result: list[dict[str, Any]] = [
        {"name": name, "forward_seconds": {}, "backward_seconds": {}} for name, _ in spec.layers
    ]
    for m in request.micro_batch_sizes:
        inputs, targets = _layer_inputs(spec, m, dtype, where)
        for i, (name, layer) in enumerate(spec.layers):
            progress.measuring(i, name, m)
            timing = LayerTiming(spec, layer, inputs[i], targets, request.seed, i == last, where)
            result[i]["forward_seconds"][str(m)] = where.median_seconds(timing.forward, request.repeats)
            result[i]["backward_seconds"][str(m)] = timing.backward_seconds(request.repeats)
        _scale_to_chained(spec, result, str(m), inputs[0], targets, request, where)
    m = max(request.micro_batch_sizes)
    progress.phase(f"activation memory of every layer at micro-batch {m}")
    inputs, targets = _layer_inputs(spec, m, dtype, where)
    for i, (_, layer) in enumerate(spec.layers):
        ids = torch.arange(m, device=where.device)
        with torch.no_grad(), sample_context(request.seed, 0, ids, where.masks), where.compute():
            out = call_layer(layer, inputs[i])
        timing = LayerTiming(spec, layer, inputs[i], targets, request.seed, i == last, where)
        saved = saved_bytes(timing.forward)
        result[i]["output_activation_bytes_per_sample"] = 0 if i == last else nbytes(out) // m
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


def build_profile(request: ProfileRequest, report: TextIO | None = None) -> dict[str, Any]:
    """The profile of ``request``'s model; what it is measuring goes to ``report`` (the command's stderr)."""
    started = time.monotonic()
    device = resolve_device(request.device, request.device_index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    spec = (
        build_spec_on_meta(request.entrypoint, request.seed)
        if request.from_config
        else build_spec(request.entrypoint, request.seed)
    )
    dtype = torch_dtype(request.dtype)
    model = nn.ModuleList([m for _, m in spec.layers]).to(dtype)
    assign_dropout_keys(spec.layers)
    model.train()
    here = Where(device, compute_context(device, request.precision))
    progress = Progress(len(spec.layers), request.micro_batch_sizes, report)
    where = f"this GPU ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "this CPU machine"
    timing = "CUDA events per layer" if device.type == "cuda" else "1 thread per layer timing"
    if request.from_config:
        sizes = request.micro_batch_sizes
        layers = profile_layers_one_at_a_time(spec, sizes, request.seed, request.repeats, here, dtype, progress)
        timing += " (built on the meta device, one layer real at a time: times not scaled to a chained run)"
    else:
        model.to(device)
        layers = profile_layers(spec, request, here, progress)
    if request.network:
        progress.phase("the network: two loopback gloo processes (at most 2 min)")
        net = measure_network()
        source = f"measured on {where}: {timing}; loopback gloo for the network"
    else:
        net = {"latency": 5e-5, "bandwidth": 1e9, "allreduce_bandwidth": 5e8}
        source = f"measured on {where}: {timing}; network figures assumed"
    if request.precision != "fp32":
        source += f"; {request.precision} autocast"
    progress.phase(f"measured in {duration(time.monotonic() - started)}")
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


def write_profile(request: ProfileRequest, out: Path, report: TextIO | None = None) -> dict[str, Any]:
    profile = build_profile(request, report)
    parse_profile(json.dumps(profile), "calibrated profile")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile, indent=1) + "\n")
    return profile
