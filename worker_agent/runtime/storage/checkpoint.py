"""Per-layer checkpoints that load into any layout.

``DIR/step-NNNNNNNN-gG/`` (``step-NNNNNNNN/`` for generation 0, a standalone run) holds one file per layer
(``LAYER.pt``: the tensors the layer owns, keyed by stable parameter name, and their optimizer state) and
``manifest.json`` (step, generation, data cursor, job hash, writer layout, file list with sizes and
checksums). How they are written (part files, the manifest last and atomically, the fence, pruning) is
:mod:`worker_agent.runtime.storage.writer`; a directory without a valid manifest is not a checkpoint, and what
"valid" means, and how files are read without trusting the manifest, is :mod:`worker_agent.runtime.storage.manifest`.
A controller generation loads exactly the checkpoint the controller committed (:func:`committed`); a
standalone run the newest valid one (:func:`newest_valid`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from morphing.errors import UserInputError
from worker_agent.runtime.errors import CheckpointError as CheckpointError
from worker_agent.runtime.errors import ForeignCheckpoint as ForeignCheckpoint
from worker_agent.runtime.storage.durable import atomic_write as atomic_write
from worker_agent.runtime.storage.manifest import FORMAT as FORMAT
from worker_agent.runtime.storage.manifest import FORMAT_V1 as FORMAT_V1
from worker_agent.runtime.storage.manifest import MANIFEST as MANIFEST
from worker_agent.runtime.storage.manifest import (
    STEP_DIR,
    FileEntry,
    Manifest,
    check_job,
    parse_manifest,
    step_directory,
    verified_copy,
    verify_file,
)
from worker_agent.runtime.storage.streams import in_parallel
from worker_agent.runtime.storage.writer import CheckpointWriter as CheckpointWriter
from worker_agent.runtime.storage.writer import LayerPayload as LayerPayload
from worker_agent.runtime.storage.writer import checkpoint_dirs as checkpoint_dirs
from worker_agent.runtime.storage.writer import serialise as serialise
from worker_agent.runtime.storage.writer import step_dir as step_dir

# This job's identity (``JobSpec.identity()``) or just its hash: checkpoints of any other job are refused.
Job = Mapping[str, Any] | str | None
_OTHER_JOB_FIX = "use another checkpoint directory, or the same entrypoint, global batch, seed and dtype"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    manifest: Manifest

    @property
    def step(self) -> int:
        return self.manifest.step

    def file_of_tensor(self) -> dict[str, str]:
        return {name: f.path for f in self.manifest.files for name in f.tensors}


def verify(path: Path, job: Job = None, *, read_files: bool = True) -> Checkpoint:
    """The checkpoint at ``path`` if its manifest (and, with ``read_files``, every file) checks out.

    Anything wrong, another job's checkpoint included, is a :class:`CheckpointError`: a damaged checkpoint.
    """
    with step_directory(path) as dir_fd:
        manifest = parse_manifest(path, dir_fd)
        if job is not None:
            check_job(path, manifest, job)
        if read_files:
            in_parallel(lambda entry: verify_file(dir_fd, path, entry), manifest.files)
    return Checkpoint(path, manifest)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-*`` directory, newest first (of one step, the newest generation first)."""
    return [(step, path) for step, _, path in checkpoint_dirs(root)]


def newest_valid(root: Path, job: Job = None, warn: Callable[[str], None] | None = None) -> Checkpoint | None:
    """The newest checkpoint under ``root`` that verifies; damaged ones are skipped and reported.

    A root that holds only another job's checkpoints is refused rather than read as empty: starting afresh
    there would write beside them and prune them.
    """
    foreign: ForeignCheckpoint | None = None
    for _, path in step_dirs(root):
        try:
            return verify(path, job)
        except CheckpointError as exc:
            if isinstance(exc, ForeignCheckpoint):
                foreign = foreign or exc
            if warn is not None:
                warn(f"skipping damaged checkpoint {exc}; falling back to the previous one")
    if foreign is not None:
        raise UserInputError(f"{root} holds no checkpoint of this job; {foreign}; {_OTHER_JOB_FIX}")
    return None


def committed(root: Path, step: int, generation: int, job: Job = None, *, read_files: bool = True) -> Checkpoint:
    """The checkpoint the controller committed: exactly ``step`` written by ``generation``, never another one.
    Without ``read_files`` only its manifest is checked here (the files are when they are loaded: there is no
    other checkpoint to fall back to, so reading them twice would only double the time a resume reads).

    Before format v2 a generation wrote ``step-NNNNNNNN``; such a (v1) checkpoint is the committed one only
    when its manifest names the same generation. Missing or damaged, it is a :class:`UserInputError`: falling
    back to any other directory could load what a generation the controller moved past wrote.
    """
    path = step_dir(root, step, generation)
    if generation and not os.path.lexists(path) and _legacy_of(step_dir(root, step), generation):
        path = step_dir(root, step)
    what = f"the committed checkpoint (step {step} of generation {generation})"
    if not os.path.lexists(path):
        raise UserInputError(
            f"{what} is not in {root} ({path.name} is missing); a job resumes only from what the controller "
            "committed: restore that directory, or cancel the job"
        )
    try:
        return verify(path, job, read_files=read_files)
    except CheckpointError as exc:
        fix = f"; {_OTHER_JOB_FIX}" if isinstance(exc, ForeignCheckpoint) else "; restore it, or cancel the job"
        raise UserInputError(f"{what} is damaged: {exc}{fix}") from exc


def _legacy_of(path: Path, generation: int) -> bool:
    """A v1 checkpoint directory (no generation in its name) whose manifest says ``generation`` wrote it."""
    try:
        with step_directory(path) as dir_fd:
            manifest = parse_manifest(path, dir_fd)
    except CheckpointError:
        return False
    return manifest.format == FORMAT_V1 and manifest.generation == generation


def resolve(path: Path, job: Job = None, warn: Callable[[str], None] | None = None) -> Checkpoint:
    """``path`` as one checkpoint (it has a manifest or is a ``step-*`` dir) or as a checkpoint root."""
    if (path / MANIFEST).exists() or STEP_DIR.match(path.name):
        try:
            return verify(path, job)
        except CheckpointError as exc:
            fix = f"; {_OTHER_JOB_FIX}" if isinstance(exc, ForeignCheckpoint) else ""
            raise UserInputError(f"checkpoint {path} is damaged: {exc}{fix}") from exc
    if not path.is_dir():
        raise UserInputError(f"{path} is not a directory")
    found = newest_valid(path, job, warn)
    if found is None:
        raise UserInputError(f"{path} holds no valid checkpoint")
    return found


def load_tensors(ckpt: Checkpoint, names: set[str]) -> dict[str, LayerPayload]:
    """The layer payloads (by file) that hold ``names``, each file verified against the manifest."""
    where = ckpt.file_of_tensor()
    missing = sorted(n for n in names if n not in where)
    if missing:
        raise UserInputError(
            f"checkpoint {ckpt.path} has no tensors {missing[:5]}: it was written for a different model"
        )
    wanted = {where[n] for n in names}
    entries = [entry for entry in ckpt.manifest.files if entry.path in wanted]
    payloads = in_parallel(lambda entry: _load_payload(ckpt.path, entry), entries)
    return {entry.path: payload for entry, payload in zip(entries, payloads, strict=True)}


def _load_payload(path: Path, entry: FileEntry) -> LayerPayload:
    """One layer file, deserialised; it must hold the tensors its manifest entry lists (a checksum that
    matches only shows the manifest and the file agree, not that the file is a layer file).

    It is loaded from a sealed private copy of exactly the bytes that were verified (:func:`verified_copy`),
    memory-mapped: the tensors are views of that copy, which nothing can change and which no file on the
    share backs, so the file changing (or vanishing) afterwards changes nothing that was loaded."""
    where = f"{path.name}/{entry.path}"
    with verified_copy(path, entry) as copy:
        try:
            # Files hold CPU tensors; a tensor saved from a GPU by another writer still loads on a CPU-only node.
            payload: object = torch.load(copy, map_location="cpu", weights_only=True, mmap=isinstance(copy, str))
        except Exception as exc:
            raise CheckpointError(f"{where}: not a layer file ({exc})") from exc
    if not isinstance(payload, dict):
        raise CheckpointError(f"{where}: not a layer file (it holds a {type(payload).__name__})")
    tensors, optimizer = payload.get("tensors"), payload.get("optimizer")
    if not isinstance(tensors, dict) or set(tensors) != set(entry.tensors):
        raise CheckpointError(f"{where}: does not hold the tensors its manifest entry lists")
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise CheckpointError(f"{where}: holds something other than tensors")
    if not isinstance(optimizer, dict) or not all(isinstance(s, dict) for s in optimizer.values()):
        raise CheckpointError(f"{where}: its optimizer state is not a dict per tensor")
    return payload


def read_all(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, flattened: ``param/NAME`` and ``optim/NAME/KEY``."""
    flat: dict[str, torch.Tensor] = {}
    for entry in ckpt.manifest.files:
        payload = _load_payload(ckpt.path, entry)
        for name, tensor in payload["tensors"].items():
            flat[f"param/{name}"] = tensor
        for name, state in payload["optimizer"].items():
            for key, value in state.items():
                flat[f"optim/{name}/{key}"] = torch.as_tensor(value)
    return flat


def check_same_job(root: Path, job: Mapping[str, Any] | str) -> None:
    """Refuse a checkpoint directory that holds only another job's checkpoints (before anything is written).

    Only manifests are read: the files are verified when the trainer loads the newest checkpoint.
    """
    foreign: ForeignCheckpoint | None = None
    for _, _, path in checkpoint_dirs(root):
        try:
            with step_directory(path) as dir_fd:
                check_job(path, parse_manifest(path, dir_fd), job)
            return
        except ForeignCheckpoint as exc:
            foreign = foreign or exc
        except CheckpointError:
            continue
    if foreign is not None:
        raise UserInputError(f"{root} holds no checkpoint of this job; {foreign}; {_OTHER_JOB_FIX}")


def diff(a: Checkpoint, b: Checkpoint) -> dict[str, Any]:
    """Largest element and relative (‖a − b‖ / ‖a‖) differences over parameters and optimizer state."""
    ta, tb = read_all(a), read_all(b)
    missing = sorted(set(ta) ^ set(tb))
    max_abs = max_rel = 0.0
    compared = 0
    worst = ""
    not_bitwise: list[str] = []  # tensors whose dtype or bytes differ
    for name in sorted(set(ta) & set(tb)):
        x, y = ta[name].double(), tb[name].double()
        if x.shape != y.shape:
            missing.append(f"{name} (shape {list(x.shape)} vs {list(y.shape)})")
            continue
        if not _same_bytes(ta[name], tb[name]):
            not_bitwise.append(name)
        compared += 1
        delta = x - y
        if delta.numel():
            biggest = float(delta.abs().max())
            max_abs = max(max_abs, biggest if math.isfinite(biggest) else math.inf)  # a NaN on one side is no agreement
        norm, dnorm = float(torch.linalg.vector_norm(x)), float(torch.linalg.vector_norm(delta))
        rel = dnorm / norm if norm > 0 else (0.0 if dnorm == 0 else math.inf)
        rel = rel if math.isfinite(rel) else math.inf
        if rel > max_rel:
            max_rel, worst = rel, name
    return {
        "step_a": a.step,
        "step_b": b.step,
        "max_abs": max_abs,
        "max_rel": max_rel,
        "tensors_compared": compared,
        "missing": missing,
        "worst": worst,
        "not_bitwise": not_bitwise,
        "same_job": a.manifest.job_hash == b.manifest.job_hash,
    }


def _same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Same dtype and the same bytes (a NaN's bits and the sign of a zero count)."""
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    flat_x, flat_y = x.detach().contiguous().reshape(-1), y.detach().contiguous().reshape(-1)
    return bool(torch.equal(flat_x.view(torch.uint8), flat_y.view(torch.uint8)))
