"""The runtime's ``PipelineStage``: it tells layout-free dropout which samples each micro-batch holds, and a
one-stage pipeline tells it its tensors up front, so its first step runs no extra forward.

Without ``input_args`` and ``output_args`` a ``PipelineStage`` infers its tensors' shapes on the schedule's
first step by running the whole stage forward once more on the first micro-batch (``DYNAMIC`` inference):
0.22 s at 43M parameters on this machine's CPU, paid by every generation (a morph's pause ends with that
step) and by every fresh start. With one stage nothing is received or sent: the inputs are the micro-batch
itself, whose shapes every dataset item shares (:func:`worker_agent.runtime.batch.signature`), and the outputs
go to the loss, where torch reads only how many there are. So both are given as meta tensors and the stage
runs ``STATIC``. With several stages the inner boundaries' shapes are the user's layers' to say, so torch
still infers them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage

from worker_agent.runtime.batch import as_tuple
from worker_agent.runtime.exact import ExactGradients
from worker_agent.runtime.model_api import sample_context


def static_metadata(item: Any, micro_batch_size: int, stages: int, dtype: torch.dtype) -> dict[str, Any]:
    """``PipelineStage`` keyword arguments for a stage that is the whole pipeline, from one dataset ``item``
    (input, target); none for a longer one."""
    if stages != 1:
        return {}
    example = tuple(
        torch.empty(
            (micro_batch_size, *t.shape),
            dtype=dtype if t.is_floating_point() else t.dtype,
            device="meta",
        )
        for t in as_tuple(item[0])
    )
    return {"input_args": example, "output_args": torch.empty(0, device="meta")}


class Batch:
    """The current step's per-slot targets, weights and sample ids (read by the loss and dropout)."""

    def __init__(self) -> None:
        self.step = 0
        self.targets = torch.empty(0)
        self.weights = torch.empty(0)
        self.sample_ids = torch.empty(0, dtype=torch.long)
        self.micro_batch_size = 1
        self.denominator = 1.0  # B, or the step's non-ignored target tokens in token mode
        self.evaluating = False  # forward only: the loss is not scaled


class Stage(PipelineStage):
    """A PipelineStage that tells layout-free dropout which samples each micro-batch holds."""

    def __init__(self, batch: Batch, seed: int, exact: ExactGradients | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._batch = batch
        self._seed = seed
        self._exact = exact

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        out = super().backward_one_chunk(*args, **kwargs)
        if self._exact is not None:
            self._exact.take()  # exact mode: this micro-batch's gradients, summed in integers
        return out

    def forward_one_chunk(
        self,
        fwd_chunk_id: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        save_forward_output: bool = True,
    ) -> Any:
        m = self._batch.micro_batch_size
        ids = self._batch.sample_ids[fwd_chunk_id * m : (fwd_chunk_id + 1) * m]
        with sample_context(self._seed, self._batch.step, ids):
            return super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
