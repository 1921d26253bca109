"""The job a trainer runs and the data it reads: both independent of the layout.

The sample indices of step ``s`` are a pure function of (seed, dataset size, global batch, s): a seeded
permutation per epoch, read as one endless stream of which step ``s`` takes ``[s*B, (s+1)*B)``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from morphing.errors import UserInputError

DTYPES = {"float32": torch.float32, "float64": torch.float64}
SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class JobSpec:
    """What a job is (``entrypoint``, ``global_batch``, ``seed``, ``dtype``) and how this run goes."""

    entrypoint: str
    global_batch: int
    seed: int = 0
    dtype: str = "float32"
    steps: int = 100
    schedule: str = "1f1b"
    checkpoint_every: int = 0
    keep: int = 3
    background_checkpoint: bool = False
    timeout_seconds: float = 20.0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise UserInputError(f"dtype={self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.schedule not in SCHEDULES:
            raise UserInputError(f"schedule={self.schedule!r}; use one of {', '.join(SCHEDULES)}")
        if self.global_batch < 1:
            raise UserInputError(f"global_batch={self.global_batch}; it must be >= 1")
        if self.steps < 0:
            raise UserInputError(f"steps={self.steps}; it must be >= 0")
        if self.keep < 1:
            raise UserInputError(f"keep={self.keep}; keep at least 1 checkpoint")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def identity(self) -> dict[str, Any]:
        """The fields that define the training result (not the layout, not the target step)."""
        return {
            "entrypoint": normalise_entrypoint(self.entrypoint),
            "global_batch": self.global_batch,
            "seed": self.seed,
            "dtype": self.dtype,
        }

    def identity_hash(self) -> str:
        return identity_hash(self.identity())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        try:
            return cls(**data)
        except TypeError as exc:
            raise UserInputError(f"malformed job spec: {exc}") from exc

    @classmethod
    def load(cls, path: Path) -> JobSpec:
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserInputError(f"cannot read job spec {path}: {exc}") from exc


def identity_hash(identity: dict[str, Any]) -> str:
    """SHA-256 of a job identity; a checkpoint's manifest records it beside the identity it hashes."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def normalise_entrypoint(entrypoint: str) -> str:
    """The entrypoint as written, without a leading ``./`` (a file moved elsewhere is the same job)."""
    target, _, func = entrypoint.rpartition(":")
    if target.endswith(".py"):
        target = Path(target).name
    return f"{target}:{func}"


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
