"""This node's GPUs as values: what each probe's raw output means, and which GPU a slot trains on.

Pure (no NVML, no torch, no processes): :mod:`worker_agent.agent.gpu_probe` collects the raw output and
these functions read it, so parsing is tested on recorded outputs without a GPU. An index is a CUDA
device index in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``), the order NVML lists GPUs in; trainers
get that order too (:func:`trainer_environment`), so index 1 means the same GPU to the probe and to them.

A trainer is told its GPU by index (``--device-index``) rather than by ``CUDA_VISIBLE_DEVICES``: warm
trainers start before anyone knows their slot (an environment is fixed at process start, an index is
not), and every process keeps seeing every GPU of the node, so NCCL sees the node's real topology.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from morphing.errors import UserInputError
from morphing.gpus import describe_gpus
from worker_agent.agent.interfaces import socket_environment

MAX_NAME = 256  # characters of a GPU's name the agent keeps (the controller refuses longer ones)

# Run as ``python -c`` by the probe: torch's view of the CUDA devices as one JSON line on stdout.
TORCH_PROBE = """\
import json, torch
devices = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory)})
print(json.dumps({"cuda": torch.version.cuda, "devices": devices}))
"""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_bytes: int


def _name(raw: object) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return "".join(c for c in text.strip() if c.isprintable())[:MAX_NAME] or "GPU"


def _memory(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
        return 0
    return int(raw)


def gpus_from_nvml(devices: Sequence[tuple[object, object]]) -> tuple[Gpu, ...]:
    """``(nvmlDeviceGetName, nvmlDeviceGetMemoryInfo().total)`` per device in NVML's order.

    Names are ``bytes`` from nvidia-ml-py before 11.5 and ``str`` after; the index is the position.
    """
    return tuple(Gpu(i, _name(name), _memory(total)) for i, (name, total) in enumerate(devices))


def gpus_from_torch(stdout: str) -> tuple[Gpu, ...]:
    """The :data:`TORCH_PROBE`'s output: its last line that is a JSON object; anything else means no GPU.

    torch and CUDA may print warnings before it; a device without a usable index is left out.
    """
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            return ()
        found: dict[int, Gpu] = {}
        for device in data["devices"]:
            index = device.get("index") if isinstance(device, dict) else None
            if isinstance(index, int) and not isinstance(index, bool) and index >= 0 and index not in found:
                found[index] = Gpu(index, _name(device.get("name", "")), _memory(device.get("memory_bytes")))
        return tuple(found[i] for i in sorted(found))
    return ()


def parse_gpu_choice(text: str) -> tuple[int, ...] | None:
    """``--gpus``: ``auto`` (None: every GPU found), ``none`` (no GPU: CPU slots) or indices ``0,1``."""
    if text.strip() == "auto":
        return None
    if text.strip() == "none":
        return ()
    try:
        chosen = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserInputError(f"--gpus {text!r}: use auto, none or device indices such as 0,1") from None
    if any(i < 0 for i in chosen) or len(set(chosen)) != len(chosen):
        raise UserInputError(f"--gpus {text!r}: device indices are >= 0, each given once")
    return chosen


def choose(found: Sequence[Gpu], chosen: tuple[int, ...] | None) -> tuple[Gpu, ...]:
    """The GPUs this agent uses, in the order ``--gpus`` names them; a missing index is a user error."""
    if chosen is None:
        return tuple(found)
    by_index = {g.index: g for g in found}
    missing = [i for i in chosen if i not in by_index]
    if missing:
        have = ", ".join(str(g.index) for g in found) or "none"
        raise UserInputError(f"--gpus: no GPU with index {missing[0]} on this node (found: {have})")
    return tuple(by_index[i] for i in chosen)


def parse_slots(text: str) -> int | None:
    """``--slots``: a count >= 1, or None for 'auto' (one per GPU)."""
    if text.strip() == "auto":
        return None
    try:
        slots = int(text)
    except ValueError:
        raise UserInputError(f"--slots {text!r}: give a number >= 1 or 'auto'") from None
    if slots < 1:
        raise UserInputError(f"--slots {slots}: a node needs at least 1 slot")
    return slots


def slot_count(requested: int | None, gpus: Sequence[Gpu]) -> int:
    """``--slots`` when given, else one slot per GPU (one slot on a node without GPUs).

    On a node with GPUs every slot trains on a GPU of its own: NCCL cannot hold two ranks of one
    communicator on one GPU, so more slots than GPUs is a :class:`UserInputError` naming the fix.
    """
    if requested is None:
        return len(gpus) or 1
    if gpus and requested > len(gpus):
        raise UserInputError(
            f"--slots {requested}: this node trains on {len(gpus)} GPU(s) ({describe(gpus)}) and each slot needs "
            f"a GPU of its own (NCCL cannot put two ranks on one GPU); use --slots {len(gpus)} or fewer "
            "(or auto), or --gpus none to offer CPU slots"
        )
    return requested


def device_for_slot(slot: int, gpus: Sequence[Gpu]) -> int | None:
    """Slot i trains on this node's i-th GPU; None on a node without GPUs (:func:`slot_count` keeps slots <= GPUs)."""
    if not gpus:
        return None
    return gpus[slot].index


def trainer_environment(
    environ: Mapping[str, str], gpus: Sequence[Gpu], socket_interface: str | None = None
) -> dict[str, str] | None:
    """The trainers' environment: the agent's, with CUDA in PCI bus order when there are GPUs, and gloo and
    NCCL bound to ``socket_interface`` (:func:`worker_agent.agent.interfaces.socket_environment`); None: as is."""
    extra = socket_environment(environ, socket_interface)
    if gpus:
        extra["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return {**environ, **extra} if extra else None


def describe(gpus: Sequence[Gpu]) -> str:
    return describe_gpus((g.name, g.memory_bytes) for g in gpus)
