"""Finding this node's GPUs once, at agent start: NVML, else torch in a subprocess, else none.

NVML (``pynvml``, from the optional ``spotmorph[gpu]`` extra) answers in milliseconds and is imported
only here, only when called. Without it, a ``python -c`` with torch answers (the agent itself never
imports torch), bounded by a timeout, and only where an NVIDIA device node exists: a CPU host (CI, a
local cluster) pays no torch start-up per agent. NVML lists every GPU whatever ``CUDA_VISIBLE_DEVICES``
says, so when that variable is set torch is asked instead: it applies the mask the trainers inherit.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from worker_agent.agent.gpus import TORCH_PROBE, Gpu, gpus_from_nvml, gpus_from_torch

log = logging.getLogger("spotmorph.agent")

PROBE_TIMEOUT_SECONDS = 60.0  # importing torch and initialising CUDA on a cold VM
NVIDIA_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version", "/dev/dxg")  # dxg: WSL2


def query_nvml() -> list[tuple[object, object]] | None:
    """``(name, total memory)`` per GPU from NVML; None when pynvml or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        return None
    nvml: Any = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.info("NVML is installed but not usable (%s)", exc)
        return None
    try:
        devices = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            devices.append((nvml.nvmlDeviceGetName(handle), nvml.nvmlDeviceGetMemoryInfo(handle).total))
        return devices
    except nvml.NVMLError as exc:
        log.warning("NVML failed while listing GPUs (%s); asking torch", exc)
        return None
    finally:
        nvml.nvmlShutdown()


def query_torch(python: str, environ: Mapping[str, str], timeout: float = PROBE_TIMEOUT_SECONDS) -> str | None:
    """The :data:`TORCH_PROBE`'s stdout, run by ``python`` in PCI bus order; None when it failed or hung."""
    env = {**environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    try:
        done = subprocess.run(
            [python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        log.warning("torch took over %.0f s to list GPUs; going on without GPUs", timeout)
        return None
    except OSError as exc:
        log.warning("cannot run %s to list GPUs (%s); going on without GPUs", python, exc.strerror or exc)
        return None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        log.warning("torch could not list GPUs (exit %d: %s); going on without GPUs", done.returncode, tail)
        return None
    return done.stdout


def nvidia_device_present(exists: Callable[[str], bool] = os.path.exists) -> bool:
    """Whether the NVIDIA driver shows a device node here (without one, CUDA finds nothing)."""
    return any(exists(path) for path in NVIDIA_DEVICES)


def discover(
    python: str,
    environ: Mapping[str, str],
    nvml: Callable[[], Sequence[tuple[object, object]] | None] = query_nvml,
    torch: Callable[[str, Mapping[str, str]], str | None] = query_torch,
    present: Callable[[], bool] = nvidia_device_present,
) -> tuple[tuple[Gpu, ...], str]:
    """This node's GPUs and which source said so (``nvml``, ``torch`` or ``none``); the probes are for tests."""
    if "CUDA_VISIBLE_DEVICES" not in environ:
        devices = nvml()
        if devices is not None:
            return gpus_from_nvml(devices), "nvml"
    if not present():
        return (), "none"
    stdout = torch(python, environ)
    return (gpus_from_torch(stdout), "torch") if stdout is not None else ((), "none")
