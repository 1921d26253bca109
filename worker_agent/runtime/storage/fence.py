"""The fence of a checkpoint directory: which job, and which of its generations, may write there now.

``DIR/.fence`` holds ``{"job": ID, "generation": G}``. A controller generation raises it to its own number
before it loads anything (every trainer of the generation does, before the rendezvous), and it only ever
goes up: the raise is a read-modify-write under a POSIX lock on ``DIR/.fence.lock`` (``lockf``, which NFS
and SMB mounts honour across hosts), and the new value replaces the file by rename. Every writer of a
fenced run checks it right before the rename that makes a manifest exist and before it deletes anything;
a writer of an older generation, or of another job, is refused with :class:`GenerationFenced`.

So a generation the controller moved past (its node cut off from the controller but not from the share,
its agent frozen, a trainer that outlived its lease) can never make a checkpoint loadable or prune the
checkpoints of the generation that replaced it, whoever can still reach whom: only the shared directory
is needed, not the controller. The controller itself never writes the fence (it may not mount the share).
Torch-free. A directory belongs to one job at a time (the controller refuses a second live job on it): the
job whose trainer raised the fence last owns it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from morphing import checkpoint_dir
from worker_agent.contract.hostile import HostileFile, load_json_bounded
from worker_agent.runtime.errors import FenceError, GenerationFenced
from worker_agent.runtime.storage.durable import atomic_write

FENCE = checkpoint_dir.FENCE
LOCK = checkpoint_dir.FENCE_LOCK
MAX_FENCE_BYTES = 4096


@dataclass(frozen=True)
class Fence:
    """Who may write a checkpoint directory: ``job``'s generation ``generation`` (and no older one)."""

    job: str
    generation: int

    def describe(self) -> str:
        return f"generation {self.generation} of {self.job}"


def read_fence(root: Path) -> Fence | None:
    """The fence of ``root``; None when none was ever raised there. A damaged one is a :class:`FenceError`."""
    path = root / FENCE
    try:
        value = load_json_bounded(path, MAX_FENCE_BYTES)
        job, generation = value["job"], value["generation"]
        if not isinstance(job, str) or not job or type(generation) is not int or generation < 0:
            raise ValueError("a job id and a generation >= 0")
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        why = str(exc) if isinstance(exc, HostileFile) else f"{path}: {str(exc)[:100]}"
        raise FenceError(
            f"the fence is damaged ({why}); it must hold the job and the newest generation "
            '({"job": "job-1", "generation": 3}): write the current ones back, or remove it only when no '
            "older generation can still be running"
        ) from None
    return Fence(job, generation)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """The fence's lock: a regular file (a FIFO or a link put in its place would block or lead elsewhere)."""
    path = root / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise FenceError(f"cannot open the fence's lock {path}: {exc.strerror or exc}; remove it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FenceError(f"the fence's lock {path} is not a regular file; remove it (it is created again)")
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def raise_fence(root: Path, ours: Fence) -> Fence:
    """Raise ``root``'s fence to ``ours`` (never lower it); :class:`GenerationFenced` when a newer generation of
    the same job holds it already. Another job's fence is taken over: the directory is this job's now."""
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        current = read_fence(root)
        if current is not None and current.job == ours.job and current.generation > ours.generation:
            raise GenerationFenced(_refused(root, ours, current))
        if current != ours:
            body = json.dumps({"job": ours.job, "generation": ours.generation}).encode()
            atomic_write(root / FENCE, body)
    return ours


def check_fence(root: Path, ours: Fence) -> None:
    """Refuse (:class:`GenerationFenced`) unless ``ours`` still holds ``root``'s fence."""
    current = read_fence(root)
    if current is None:
        raise GenerationFenced(
            f"{ours.describe()} raised the fence of {root} but {root / FENCE} is gone now (the directory was "
            "replaced or emptied); nothing is committed there"
        )
    if current != ours:
        raise GenerationFenced(_refused(root, ours, current))


def _refused(root: Path, ours: Fence, current: Fence) -> str:
    whose = "a newer generation" if current.job == ours.job else "another job"
    return (
        f"{ours.describe()} is fenced off: {whose} ({current.describe()}) owns {root} now, so the controller "
        "has moved past this generation; it stops without committing, loading or deleting any checkpoint"
    )
