"""This host's GPUs shared among the local cluster's VMs: each VM's agent gets GPUs of its own.

The local cluster's "VMs" are processes on one host, and an agent started with ``--gpus auto`` takes
every GPU it finds, so two of them would put two ranks on one GPU (which NCCL cannot do). With
``spotmorph local up --gpus-per-node K`` each agent is given ``--gpus i,j``: K of the GPUs that no live VM
of the cluster holds, lowest index first, so a VM that dies frees its GPUs for the next one. Which GPUs
the host has is probed once, by ``up``, and recorded in the cluster's ``gpus.json``. Without
``--gpus-per-node`` (0) the agents get ``--gpus none``: CPU slots, as before.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from morphing.errors import UserInputError

GPUS_FLAG = "--gpus"
MAX_INVENTORY_BYTES = 1 << 20


def held_by(command: Sequence[str]) -> tuple[int, ...]:
    """The GPU indices an agent's command line gives it: ``--gpus i,j``; none for ``none``, ``auto`` or no flag."""
    for flag, value in itertools.pairwise(command):
        if flag == GPUS_FLAG:
            return tuple(int(part) for part in value.split(",") if part.strip().isdigit())
    return ()


def allocate(inventory: Sequence[int], held: Iterable[int], count: int) -> tuple[int, ...]:
    """``count`` GPUs of ``inventory`` that nobody ``held``, lowest index first; a :class:`UserInputError`
    naming what is free and what is held when there are not enough."""
    taken = set(held)
    free = [i for i in sorted(set(inventory)) if i not in taken]
    if len(free) < count:
        have = ",".join(map(str, sorted(set(inventory)))) or "none"
        busy = ",".join(map(str, sorted(taken & set(inventory)))) or "none"
        raise UserInputError(
            f"no {count} free GPU(s) for another node: this host's GPUs are {have} and the cluster's running "
            f"nodes hold {busy}; stop a node first, or bring the cluster up with a smaller --gpus-per-node "
            "(0 for CPU slots)"
        )
    return tuple(free[:count])


def flag_value(gpus: Sequence[int]) -> str:
    """What ``--gpus`` says for ``gpus``: the indices, or ``none`` (CPU slots)."""
    return ",".join(str(i) for i in gpus) or "none"


def record(path: Path, indices: Sequence[int]) -> None:
    """Write the host's GPU indices as ``up`` found them."""
    path.write_text(json.dumps({"indices": sorted(indices)}))


def recorded(path: Path) -> tuple[int, ...]:
    """The GPU indices ``up`` recorded; a damaged or missing record is a :class:`UserInputError` saying so."""
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_INVENTORY_BYTES))
        indices = data["indices"]
        if not isinstance(indices, list) or not all(type(i) is int and i >= 0 for i in indices):
            raise ValueError("indices must be a list of integers >= 0")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserInputError(
            f"the local cluster's GPU record {path} cannot be read ({str(exc)[:100]}); "
            "bring the cluster down and up again (`spotmorph local down`, `spotmorph local up --gpus-per-node K`)"
        ) from None
    return tuple(indices)
