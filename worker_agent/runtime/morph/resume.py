"""Which checkpoint a trainer starts from, and the fence a controller generation raises before that.

- A controller generation (``--fence-job``) first raises the checkpoint dir's fence to its own generation
  (:mod:`worker_agent.runtime.storage.fence`), so no older generation can commit or delete anything there from
  then on, and then loads exactly the checkpoint the controller committed (``--resume STEP:GENERATION``),
  or nothing when none was committed: never "the newest on disk", which a generation the controller moved
  past may have written. A checkpoint committed by the controller from parts several trainers wrote is
  loaded the same way: it is a step directory of its generation with a manifest.
- A standalone run (``spotmorph train``) takes ``--load-from`` or else the newest valid checkpoint in its
  directory, as it always has, and raises no fence.

Rank 0 reads every file of a checkpoint only when it must pick a valid one among several (standalone); the
committed one has no alternative, so only its manifest is checked before the load, and each rank checks the
files it loads (:func:`loaded_by_all`): every byte is read once, not twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from morphing.errors import UserInputError
from worker_agent.contract import TrainerArguments
from worker_agent.runtime.errors import CheckpointError
from worker_agent.runtime.storage import checkpoint as ckpt_mod
from worker_agent.runtime.storage.fence import Fence, raise_fence


def fence_of(cfg: TrainerArguments) -> Fence | None:
    """The fence a controller generation holds: raised here, before it loads anything; None when standalone."""
    if cfg.fence_job is None:
        return None
    return raise_fence(cfg.checkpoint_dir, Fence(cfg.fence_job, cfg.generation))


def choose(cfg: TrainerArguments, job: Mapping[str, Any], skipped: Callable[[str], None]) -> tuple[str | None, str]:
    """Rank 0's choice: the checkpoint to resume from (None: from scratch) and, instead, why none can be used."""
    found: ckpt_mod.Checkpoint | None
    try:
        if cfg.fence_job is not None:
            resume = cfg.resume
            found = (
                ckpt_mod.committed(cfg.checkpoint_dir, resume.step, resume.generation, job, read_files=False)
                if resume
                else None
            )
        elif cfg.load_from is not None:
            found = ckpt_mod.resolve(cfg.load_from, job, skipped)
        else:
            found = ckpt_mod.newest_valid(cfg.checkpoint_dir, job, skipped)
    except UserInputError as exc:
        return None, str(exc)
    return (str(found.path) if found else None), ""


def same_directory(chosen: str | None, checkpoint_dir: Path) -> bool:
    """Whether the checkpoint resumed from lies in the directory this run writes to (or there is none)."""
    return chosen is None or Path(chosen).resolve().parent == checkpoint_dir.resolve()


T = TypeVar("T")


def loaded_by_all(load: Callable[[], T], checkpoint: str | None, world_size: int) -> T:
    """Collective: ``load()`` on every rank, each checking the files it reads; a damaged file any rank finds
    fails every rank with the same :class:`UserInputError` (otherwise the others would train on and meet the
    failed rank as a lost peer)."""
    bad = ""
    try:
        result = load()
    except CheckpointError as exc:
        bad = str(exc)
    said: list[str | None] = [None] * world_size
    dist.all_gather_object(said, bad)
    found = next((why for why in said if why), "")
    if found:
        raise UserInputError(f"checkpoint {checkpoint} is damaged: {found}; restore it, or cancel the job")
    return result
