"""What the runtime adds to the job spec (:mod:`morphing.jobspec`): its torch dtype and the data it reads.

The sample indices of step ``s`` are a pure function of (seed, dataset size, global batch, s): a seeded
permutation per epoch, read as one endless stream of which step ``s`` takes ``[s*B, (s+1)*B)``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from morphing.errors import UserInputError
from morphing.jobspec import DType, JobSpec, job_spec_from_json
from worker_agent.contract.hostile import HostileFile, read_bounded

MAX_INPUT_BYTES = 1 << 20  # job.json and layout.json: a spec and a layout are a few kilobytes
_TORCH_DTYPES: dict[DType, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}


def torch_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype a job's ``dtype`` names."""
    return _TORCH_DTYPES[dtype]


def load_job_spec(path: Path) -> JobSpec:
    """The spec a trainer was given (``job.json``); a bad one is a :class:`UserInputError`."""
    try:
        text = read_bounded(path, MAX_INPUT_BYTES).decode(errors="replace")
    except (OSError, HostileFile) as exc:
        raise UserInputError(f"cannot read job spec {path}: {exc}") from exc
    return job_spec_from_json(text, what=f"job spec {path}")


@lru_cache(maxsize=4)
def _epoch_permutation(seed: int, epoch: int, size: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=gen)


def step_indices(step: int, global_batch: int, dataset_size: int, seed: int) -> list[int]:
    """The ``global_batch`` dataset indices of ``step``, identical for every layout."""
    out: list[int] = []
    for n in range(step * global_batch, (step + 1) * global_batch):
        epoch, pos = divmod(n, dataset_size)
        out.append(int(_epoch_permutation(seed, epoch, dataset_size)[pos]))
    return out


def data_cursor(step: int, global_batch: int, dataset_size: int) -> dict[str, int]:
    consumed = step * global_batch
    return {"samples_consumed": consumed, "epoch": consumed // dataset_size, "offset": consumed % dataset_size}
