"""Per-layer checkpoints that load into any layout.

``DIR/step-NNNNNNNN/`` holds one file per layer (``LAYER.pt``: the tensors the layer owns, keyed by
stable parameter name, and their optimizer state) and ``manifest.json`` (step, data cursor, job hash,
writer layout, file list with sizes and SHA-256). Each rank writes the layers it was given, then an
atomic part file listing them; rank 0 waits for every part and writes the manifest last, atomically
(temp file, fsync, rename). A directory without a valid manifest is not a checkpoint; what "valid"
means, and how files are read without trusting the manifest, is :mod:`worker_agent.runtime.manifest`.
No collective is involved, so writes can run in a background thread while training goes on.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from morphing.errors import UserInputError
from worker_agent.runtime.errors import CheckpointError as CheckpointError
from worker_agent.runtime.errors import CheckpointWriteFailed
from worker_agent.runtime.errors import ForeignCheckpoint as ForeignCheckpoint
from worker_agent.runtime.manifest import FORMAT as FORMAT
from worker_agent.runtime.manifest import MANIFEST as MANIFEST
from worker_agent.runtime.manifest import (
    STEP_DIR,
    FileEntry,
    Manifest,
    check_job,
    parse_manifest,
    read_file,
    read_layer_file,
    step_directory,
)

LayerPayload = dict[str, Any]
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


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file, fsync it, rename it over ``path`` and fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def serialise(payload: LayerPayload) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def verify(path: Path, job: Job = None, *, read_files: bool = True) -> Checkpoint:
    """The checkpoint at ``path`` if its manifest (and, with ``read_files``, every file) checks out.

    Anything wrong, another job's checkpoint included, is a :class:`CheckpointError`: a damaged checkpoint.
    """
    with step_directory(path) as dir_fd:
        manifest = parse_manifest(path, dir_fd)
        if job is not None:
            check_job(path, manifest, job)
        if read_files:
            for entry in manifest.files:
                read_file(dir_fd, path, entry)
    return Checkpoint(path, manifest)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-*`` directory, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


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
    return {entry.path: _load_payload(ckpt.path, entry) for entry in ckpt.manifest.files if entry.path in wanted}


def _load_payload(path: Path, entry: FileEntry) -> LayerPayload:
    """One layer file, deserialised; it must hold the tensors its manifest entry lists (a SHA-256 that
    matches only shows the manifest and the file agree, not that the file is a layer file)."""
    data = read_layer_file(path, entry)
    where = f"{path.name}/{entry.path}"
    try:
        # Files hold CPU tensors; a tensor saved from a GPU by another writer still loads on a CPU-only node.
        payload: object = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
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


class CheckpointWriter:
    """Writes this rank's share of each checkpoint; rank 0 also commits the manifest and prunes."""

    def __init__(
        self, root: Path, rank: int, world_size: int, run_id: str, keep: int, background: bool, timeout: float
    ) -> None:
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self.keep = keep
        self.background = background
        self.timeout = timeout
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_committed: int | None = None
        self.bytes_written = 0
        self.seconds_writing = 0.0

    def save(self, step: int, payloads: dict[str, LayerPayload], manifest: dict[str, Any] | None) -> None:
        """Write ``payloads`` (already copied off the live tensors); ``manifest`` only on rank 0."""
        self.wait()
        if self.background:
            self._thread = threading.Thread(
                target=self._guarded, args=(step, payloads, manifest), name="checkpoint-writer", daemon=True
            )
            self._thread.start()
        else:
            self._write(step, payloads, manifest)

    def wait(self) -> None:
        """Block until the previous write is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _guarded(self, step: int, payloads: dict[str, LayerPayload], manifest: dict[str, Any] | None) -> None:
        try:
            self._write(step, payloads, manifest)
        except BaseException as exc:
            self._error = exc

    def _write(self, step: int, payloads: dict[str, LayerPayload], manifest: dict[str, Any] | None) -> None:
        try:
            self._write_files(step, payloads, manifest)
        except OSError as exc:
            directory = step_dir(self.root, step)
            if not (directory / MANIFEST).exists():
                shutil.rmtree(directory, ignore_errors=True)
            kept = f"step {self.last_committed}" if self.last_committed is not None else "none written by this run"
            raise CheckpointWriteFailed(
                f"checkpoint step {step} could not be written to {self.root}: {exc.strerror or exc}; "
                f"its partial files were removed and the previous checkpoint ({kept}) is kept; "
                "free space or point the job at another checkpoint_dir"
            ) from exc

    def _write_files(self, step: int, payloads: dict[str, LayerPayload], manifest: dict[str, Any] | None) -> None:
        started = time.perf_counter()
        directory = step_dir(self.root, step)
        parts = directory / ".parts"
        parts.mkdir(parents=True, exist_ok=True)
        entries = []
        for layer, payload in payloads.items():
            data = serialise(payload)
            path = directory / f"{layer}.pt"
            atomic_write(path, data)
            self.bytes_written += len(data)
            entries.append(
                {
                    "path": path.name,
                    "layer": layer,
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "tensors": sorted(payload["tensors"]),
                    "writer_rank": self.rank,
                }
            )
        atomic_write(parts / f"{self.run_id}-rank-{self.rank}.json", json.dumps(entries).encode())
        if manifest is not None:
            self._commit(step, directory, parts, manifest)
        self.seconds_writing += time.perf_counter() - started

    def _commit(self, step: int, directory: Path, parts: Path, manifest: dict[str, Any]) -> None:
        deadline = time.monotonic() + self.timeout
        names = [parts / f"{self.run_id}-rank-{r}.json" for r in range(self.world_size)]
        while not all(p.exists() for p in names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint step {step}: not every rank wrote its part in {self.timeout}s")
            time.sleep(0.02)
        files = sorted((e for p in names for e in json.loads(p.read_text())), key=lambda e: e["path"])
        body = {"format": FORMAT, **manifest, "step": step, "files": files, "committed_at": time.time()}
        atomic_write(directory / MANIFEST, json.dumps(body, indent=1, sort_keys=True).encode())
        shutil.rmtree(parts, ignore_errors=True)
        self.last_committed = step
        self._prune(step)

    def _prune(self, committed: int) -> None:
        valid = 0
        for step, path in step_dirs(self.root):
            if step > committed:
                continue
            if (path / MANIFEST).exists() and valid < self.keep:
                valid += 1
                continue
            shutil.rmtree(path, ignore_errors=True)


def check_same_job(root: Path, job: Mapping[str, Any] | str) -> None:
    """Refuse a checkpoint directory that holds only another job's checkpoints (before anything is written).

    Only manifests are read: the files are verified when the trainer loads the newest checkpoint.
    """
    foreign: ForeignCheckpoint | None = None
    for _, path in step_dirs(root):
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
    for name in sorted(set(ta) & set(tb)):
        x, y = ta[name].double(), tb[name].double()
        if x.shape != y.shape:
            missing.append(f"{name} (shape {list(x.shape)} vs {list(y.shape)})")
            continue
        compared += 1
        delta = x - y
        if delta.numel():
            max_abs = max(max_abs, float(delta.abs().max()))
        norm, dnorm = float(torch.linalg.vector_norm(x)), float(torch.linalg.vector_norm(delta))
        rel = dnorm / norm if norm > 0 else (0.0 if dnorm == 0 else float("inf"))
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
    }
