"""Where a trainer computes and in what precision: the job's ``device`` and ``precision`` made concrete.

``device: auto`` means CUDA when this node has a usable GPU and CPU otherwise; ``cuda`` on a node
without one is the user's mistake (exit 2 with the fix), never a traceback. A rank's GPU is its slot's
index (``TrainerArguments.device_index``). ``precision`` bf16 / fp16 runs the forward (and the loss)
under ``torch.autocast`` for the device, including CPU autocast, so a CPU machine runs the same code.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from morphing.jobspec import Device, Precision
from worker_agent.runtime.errors import NodeUnfit

_AUTOCAST_DTYPES: dict[Precision, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
NO_CUDA = (
    "device cuda was asked for, but torch.cuda.is_available() is false here (no GPU, no driver, or a CPU build "
    "of torch); use device cpu (--device cpu, or device: cpu in the job spec), or run on a node with a GPU and "
    "the CUDA build of torch"
)


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def resolve_device(requested: Device, index: int | None = None) -> torch.device:
    """The torch device a rank computes on; :class:`NodeUnfit` (a user error of this node) when CUDA is asked
    for and absent here."""
    if requested == "cpu" or (requested == "auto" and not cuda_available()):
        return torch.device("cpu")
    if not cuda_available():
        raise NodeUnfit(NO_CUDA)
    gpu = 0 if index is None else index
    count = torch.cuda.device_count()
    if gpu >= count:
        raise NodeUnfit(
            f"this rank was given GPU {gpu}, but the node has {count} visible (CUDA_VISIBLE_DEVICES); "
            "give each rank a GPU of its own, or use device: cpu"
        )
    return torch.device("cuda", gpu)


def autocast_dtype(precision: Precision) -> torch.dtype | None:
    """The dtype autocast computes in, or None for fp32 (no autocast: compute in the job's dtype)."""
    return _AUTOCAST_DTYPES[precision]


def compute_context(device: torch.device, precision: Precision) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A factory of the context forward passes (and losses) run in: autocast, or nothing for fp32."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], Any], repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn`` after one warm-up run; CUDA events on a GPU (kernels run asynchronously)."""
    fn()
    times = []
    for _ in range(repeats):
        with stopwatch(device) as elapsed:
            fn()
        times.append(elapsed())
    return max(statistics.median(times), 1e-9)


@contextlib.contextmanager
def stopwatch(device: torch.device) -> Iterator[Callable[[], float]]:
    """Times the block; the yielded function returns its seconds once the block is over."""
    result = [0.0]
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        yield lambda: result[0]
        end.record()
        end.synchronize()
        result[0] = start.elapsed_time(end) / 1e3
    else:
        began = time.perf_counter()
        yield lambda: result[0]
        result[0] = time.perf_counter() - began
