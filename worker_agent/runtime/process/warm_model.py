"""The model a trainer built, kept for the next generation of the same job on the same process.

Building a spec (the user's imports, every layer initialised from the seed, the start-up checks that run
each layer) costs about a second at 43M parameters on two cores, and each generation of a job builds the
same model. A trainer that held its stage for the next generation (:mod:`worker_agent.runtime.morph.held`)
therefore starts that generation on the model it has. What a fresh build would differ in is put right:
every parameter of the new stage is loaded (from peers' memory or the disk) before the first step,
buffers go back to the tensors and values they had as built (by name, as the start-up checks put them back:
a forward may replace one or register another), gradients are dropped, and a generation that finds nothing to
resume from takes its initial weights from a fresh build (:func:`initial_weights`). Only a model on the
CPU is kept: on a GPU node the next generation may put another process on that GPU, which needs its
memory (and no GPU has run it). Not put right: what a module keeps in plain attributes (a cache it fills in
forward); the start-up checks cannot see those either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from morphing.jobspec import JobSpec
from morphing.layout import Layout
from worker_agent.runtime.model.checks import BufferSnapshot
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.partition import PartitionedModel
from worker_agent.runtime.model.precision import check_float64
from worker_agent.runtime.numerics.job import torch_dtype

if TYPE_CHECKING:
    from worker_agent.runtime.pipeline.engine import StageRunner


@dataclass
class Built:
    """A built model, the job it was built for, and its buffers as built."""

    key: tuple[str, str]
    model: PartitionedModel
    buffers: BufferSnapshot
    trained: bool = True  # False while only prepared: its weights are still the initial ones


class ModelShelf:
    """The one model this process keeps between generations (owned by the process:
    :class:`worker_agent.runtime.process.trainer_process.TrainerProcess`; a warm trainer fills it ahead of its
    assignment)."""

    def __init__(self) -> None:
        self.built: Built | None = None

    def model_for(self, job: JobSpec, layout: Layout, device: torch.device) -> tuple[PartitionedModel, bool]:
        """The job's model, checked against ``layout``; True when a past generation of this process trained it."""
        key = (job.entrypoint, job.identity_hash())
        built = self.built
        if built is not None and built.key == key and device.type == "cpu":
            built.buffers.restore()
            model, trained = built.model, built.trained
            model.check_layout(layout)
            for module in model.modules:
                module.zero_grad(set_to_none=True)  # a step that failed in a collective may have left gradients
            built.trained = True  # from here on, this generation trains it
            return model, trained
        self.built = None  # another job's model: let it go before this one is built
        model = build(job)
        model.check_layout(layout)
        if device.type == "cpu":
            self.built = Built(key, model, BufferSnapshot(model.modules))
        return model, False

    def prepare(self, job: JobSpec, touch: bool) -> bool:
        """Build ``job``'s model before any assignment (a free node's hint that a growth may bring the job here),
        so :meth:`model_for` finds it built and the growth's pause does not hold the build. CPU jobs only, as
        :meth:`model_for` keeps; ``touch``: this process keeps the memory it frees
        (:func:`worker_agent.runtime.process.allocator.keep_freed_memory`), so touching what a growth needs pays.
        False when there was nothing to do."""
        key = (job.entrypoint, job.identity_hash())
        if job.device != "cpu" or (self.built is not None and self.built.key == key):
            return False
        self.built = None  # another job's model: let it go first
        model = build(job)
        self.built = Built(key, model, BufferSnapshot(model.modules), trained=False)
        if touch:
            touch_memory(RESERVE_PER_PARAMETER_BYTE * sum(t.numel() * t.element_size() for t in model.tensors.values()))
        return True

    def forget(self) -> None:
        """Drop the kept model (the process is about to leave, or the job's state went elsewhere)."""
        self.built = None


# What a growth brings a new rank beside the model it built: the moved parameters and optimizer state (AdamW:
# two moments) and its first step's gradients, in parameter bytes.
RESERVE_PER_PARAMETER_BYTE = 4


def touch_memory(nbytes: int) -> int:
    """Fault ``nbytes`` of heap in and free them: kept by the process (:mod:`worker_agent.runtime.process.allocator`),
    the pages are there, zeroed, when the growth's moves land, instead of being faulted in one at a time inside
    the pause (measured: 516 MB received into fresh memory took 0.19 s, into touched memory 0.06 s). At most
    half the memory the node has free, so a large model's build ahead never takes a node's memory from others;
    returns the bytes touched."""
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
    nbytes = min(nbytes, free // 2)
    if nbytes > 0:
        block = torch.empty(nbytes, dtype=torch.uint8)
        block.fill_(0)
        del block
    return max(nbytes, 0)


def build(job: JobSpec, check: bool = True) -> PartitionedModel:
    """A fresh model in the job's dtype, its spec checked (:func:`build_spec`)."""
    spec = build_spec(job.entrypoint, job.seed, check=check)
    model = PartitionedModel(spec, untie=job.exact)
    model.to_dtype(torch_dtype(job.dtype))
    if job.dtype == "float64":
        check_float64(spec)  # nothing inside computes in float32 (it would make the result the layout's)
    return model


def initial_weights(job: JobSpec, runner: StageRunner) -> None:
    """Give the stage of a reused model (trained by a past generation) the job's initial weights."""
    fresh = build(job, check=False)
    with torch.no_grad():
        for name, param in runner.params:
            param.copy_(fresh.tensors[name])
    if runner.exact is not None:
        runner.model.sync_copies(runner.layout, runner.stage)
