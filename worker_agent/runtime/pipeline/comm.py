"""Process groups, one per purpose, and their backends.

The world group is gloo on every device: it carries the small control collectives (the per-step stop /
checkpoint-request / loss all-reduce, the fp16 overflow flag, the checkpoint choice), whose tensors live on
the CPU; its timeout is switched between the job's two (:class:`worker_agent.runtime.morph.salvage.Timeouts`).
The groups that move model tensors (each replica's pipeline: point-to-point and the clipping norm; each
stage's data-parallel gradient all-reduce; tied copies) use NCCL when the tensors are on a GPU
and gloo otherwise, so a CPU run is exactly what it always was. These groups have the job's
``peer_timeout_seconds`` (a failed collective is a lost peer: :mod:`worker_agent.runtime.morph.salvage`). NCCL
runs in blocking-wait mode (:func:`configure_nccl`): a collective that fails or outlives the timeout
raises in the calling thread, before the optimizer step could use what it returned, and the process
lives on to hold its step for a just-in-time checkpoint. A rank that exits aborts its NCCL communicators
first, and one whose agent asks (:class:`worker_agent.runtime.morph.salvage.AbortWatch`) aborts them at once.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from morphing.layout import Layout
from worker_agent.runtime.model.partition import PartitionedModel


class Communicators:
    """The NCCL communicators this process created, over all its generations, aborted before it exits or when its
    agent asks (:class:`worker_agent.runtime.morph.salvage.AbortWatch`): the process owns them, not a module, and both
    the main thread (on its way out, or holding a step) and the watcher thread abort them, hence the lock."""

    def __init__(self) -> None:
        self._groups: list[dist.ProcessGroup] = []
        self._lock = threading.Lock()

    def add(self, group: dist.ProcessGroup) -> None:
        with self._lock:
            self._groups.append(group)

    def abort(self) -> None:
        """Abort every communicator (newest first), so no GPU kernel waits on a peer that is gone; a group that
        cannot be aborted is said, not hidden."""
        with self._lock:
            while self._groups:
                group = self._groups.pop()
                try:
                    _abort(group)
                except Exception as error:  # best effort on the way out: the process exits or holds next
                    print(f"spotmorph trainer: warning: could not abort an NCCL group: {error!r}", file=sys.stderr)


NCCL_ENVIRONMENT = {
    # wait() blocks until the collective is done and raises DistBackendError when it failed or timed out,
    # so the step is abandoned before its optimizer update (the salvage's premise) ...
    "TORCH_NCCL_BLOCKING_WAIT": "1",
    # ... and the watchdog does not tear the process down (its default), which would lose the held step;
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    # nor does the heartbeat monitor, which kills a process whose watchdog is stuck (an abort can take a while).
    "TORCH_NCCL_ENABLE_MONITORING": "0",
}


def configure_nccl() -> None:
    """Set :data:`NCCL_ENVIRONMENT` before the first NCCL group exists (ProcessGroupNCCL reads it then)."""
    os.environ.update(NCCL_ENVIRONMENT)


def tensor_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass(frozen=True)
class Groups:
    """Process groups this rank belongs to (``None`` where the group would have one member)."""

    replica: dist.ProcessGroup
    pipeline: dist.ProcessGroup | None
    data_parallel: dist.ProcessGroup | None
    tied: dict[str, dist.ProcessGroup] = field(default_factory=dict)


def make_groups(
    layout: Layout,
    model: PartitionedModel,
    rank: int,
    device: torch.device,
    timeout_seconds: float,
    communicators: Communicators,
) -> Groups:
    """Create every group in the same order on every rank (a collective requirement), keep ours; ``communicators``
    gets the NCCL ones this rank belongs to."""
    backend = tensor_backend(device)
    timeout = timedelta(seconds=timeout_seconds)

    def new_group(ranks: list[int]) -> dist.ProcessGroup:
        group: dist.ProcessGroup = dist.new_group(ranks, timeout=timeout, backend=backend)
        if backend == "nccl" and rank in ranks:
            communicators.add(group)
        return group

    p, d = layout.pipeline_stages, layout.data_parallel
    replica, stage = layout.coords(rank)
    pipeline = data_parallel = own = None
    for r in range(d):
        group = new_group([layout.rank(r, s) for s in range(p)])
        if r == replica:
            own = group
            pipeline = group if p > 1 else None
    for s in range(p):
        group = new_group([layout.rank(r, s) for r in range(d)])
        if s == stage and d > 1:
            data_parallel = group
    tied: dict[str, dist.ProcessGroup] = {}
    for name, holders in model.tied_across_stages(layout):
        group = new_group(sorted(layout.rank(r, s) for r in range(d) for s in holders))
        if stage in holders:
            tied[name] = group
    assert own is not None
    return Groups(own, pipeline, data_parallel, tied)


def peer_world(world_size: int, timeout_seconds: float) -> dist.ProcessGroup:
    """A gloo group of every rank whose point-to-point receives give up after ``timeout_seconds``: the world
    group's keep the timeout they were created with (the job's long one), whatever ``_set_pg_timeout`` says
    later, so held layers moved over it would wait that long on a silent peer. A collective: every rank
    creates it at the same point."""
    group: dist.ProcessGroup = dist.new_group(
        list(range(world_size)), timeout=timedelta(seconds=timeout_seconds), backend="gloo"
    )
    return group


def _abort(group: dist.ProcessGroup) -> None:
    """``ProcessGroup.abort`` where torch has it, else the NCCL backend's own ``abort``."""
    if hasattr(group, "abort"):
        group.abort()
    else:
        group._get_backend(torch.device("cuda")).abort()
