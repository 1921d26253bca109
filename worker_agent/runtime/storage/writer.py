"""Writing checkpoints: each rank its layers and a part file, rank 0 the manifest, then pruning.

Each rank writes the layers it was given (``LAYER.pt``, serialised straight into the file and hashed on the
way, a few files at once: :mod:`worker_agent.runtime.storage.streams`), then an atomic part file
``.parts/gen-G-RUN-rank-R.json`` holding its generation, its rank and its file entries; rank 0 waits for
every part of its generation and writes the manifest last, atomically. Every generation writes its own
directories (``step-NNNNNNNN-gG``), so two generations never write the same path. A fenced writer (a
controller generation, :mod:`worker_agent.runtime.storage.fence`) checks the fence before it writes, right before
the manifest's rename, and before each directory it deletes: once a newer generation raised the fence it
commits and deletes nothing (:class:`GenerationFenced`), and it removes its own unfinished directory.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch

from worker_agent.contract.hostile import HostileFile, load_json_bounded
from worker_agent.runtime.errors import CheckpointWriteFailed, FenceError
from worker_agent.runtime.storage.durable import atomic_write, atomic_write_stream
from worker_agent.runtime.storage.fence import Fence, check_fence
from worker_agent.runtime.storage.manifest import FORMAT, MANIFEST, MAX_MANIFEST_BYTES, dir_name, parse_dir_name
from worker_agent.runtime.storage.streams import HashingWriter, in_parallel

LayerPayload = dict[str, Any]
TRASH = ".trash-"  # a directory being deleted is renamed first, so it stops being a checkpoint at once


def step_dir(root: Path, step: int, generation: int = 0) -> Path:
    return root / dir_name(step, generation)


def checkpoint_dirs(root: Path) -> list[tuple[int, int, Path]]:
    """``(step, generation, path)`` of every checkpoint directory, newest first (by step, then generation)."""
    if not root.is_dir():
        return []
    found = [(*named, p) for p in root.iterdir() if (named := parse_dir_name(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def serialise(payload: LayerPayload) -> bytes:
    """A layer file's bytes in memory (what :func:`write_layer_files` streams to the disk instead)."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def write_layer_file(directory: Path, layer: str, payload: LayerPayload, rank: int) -> dict[str, Any]:
    """``LAYER.pt`` in ``directory``, serialised straight into the (atomically renamed) file and hashed on
    the way, and the manifest entry that lists it."""
    path = directory / f"{layer}.pt"
    written = atomic_write_stream(path, lambda fh: _save(payload, fh))
    return {
        "path": path.name,
        "layer": layer,
        "bytes": written.size,
        "xxh3_128": written.hexdigest(),
        "tensors": sorted(payload["tensors"]),
        "writer_rank": rank,
    }


def _save(payload: LayerPayload, fh: BinaryIO) -> HashingWriter:
    out = HashingWriter(fh)
    torch.save(payload, cast(IO[bytes], out))  # torch needs only write() and flush()
    return out


def write_layer_files(directory: Path, payloads: dict[str, LayerPayload], rank: int) -> list[dict[str, Any]]:
    """Each layer's file in ``directory`` (a few at once), and the manifest entries that list them (in the
    order of ``payloads``). When one fails, the rest not yet started are not written, and none is still
    being written when the error is raised."""
    return in_parallel(lambda item: write_layer_file(directory, item[0], item[1], rank), list(payloads.items()))


def part_name(generation: int, run_id: str, rank: int) -> str:
    return f"gen-{generation}-{run_id}-rank-{rank}.json"


class CheckpointWriter:
    """Writes this rank's share of each checkpoint; rank 0 also commits the manifest and prunes.

    ``fence``: the fence this run raised (a controller generation), checked before every commit and
    deletion; None for a standalone run. ``resumed_from``: the step the run loaded (0: none); a fenced
    run deletes the checkpoints older generations wrote past it (written after the controller moved on).
    """

    def __init__(
        self,
        root: Path,
        rank: int,
        world_size: int,
        run_id: str,
        keep: int,
        background: bool,
        timeout: float,
        generation: int = 0,
        fence: Fence | None = None,
        resumed_from: int = 0,
        acknowledged: Callable[[], int] | None = None,
        job_hash: str | None = None,
    ) -> None:
        self.root = root
        self.job_hash = job_hash  # this job's identity: pruning leaves every other job's checkpoints alone
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self.keep = keep
        self.background = background
        self.timeout = timeout
        self.generation = generation
        self.fence = fence
        self.resumed_from = resumed_from
        self.acknowledged = acknowledged
        self._thread: threading.Thread | None = None
        self._files_written = threading.Event()  # the write in flight read every tensor it was given
        self._files_written.set()
        self._error: BaseException | None = None
        self.last_committed: int | None = None
        self.bytes_written = 0
        self.seconds_writing = 0.0

    def save(
        self,
        step: int,
        payloads: dict[str, LayerPayload],
        manifest: dict[str, Any] | None,
        done: Callable[[], None] | None = None,
        background: bool | None = None,
    ) -> None:
        """Write ``payloads`` (copies, or live tensors left alone until :meth:`files_written`); ``manifest``
        only on rank 0. ``done`` is called once the write is over, written or failed (the host buffers may then
        be reused). ``background`` overrides the job's choice for this write."""
        self.wait()
        self._files_written.clear()
        if self.background if background is None else background:
            self._thread = threading.Thread(
                target=self._guarded, args=(step, payloads, manifest, done), name="checkpoint-writer", daemon=True
            )
            self._thread.start()
        else:
            try:
                self._write(step, payloads, manifest)
            finally:
                self._files_written.set()
                if done is not None:
                    done()

    def wait(self) -> None:
        """Block until the previous write is done; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def files_written(self) -> None:
        """Block until the write in flight has read every tensor it was given (they may change after); its
        commit may still be under way. :class:`CheckpointWriteFailed` past the writer's timeout."""
        if not self._files_written.wait(self.timeout):
            raise CheckpointWriteFailed(
                f"the background checkpoint write to {self.root} has not read the state it was given after "
                f"{self.timeout:.0f} s, so training cannot update it; the disk is too slow or hung: check it, or "
                "point the job at another checkpoint_dir"
            )

    def check_fence(self) -> None:
        """:class:`GenerationFenced` when a newer generation (or another job) owns the directory now."""
        if self.fence is not None:
            check_fence(self.root, self.fence)

    def fenced_off(self) -> str:
        """Why this run may no longer write here ("" while its fence holds); checked at every step boundary."""
        try:
            self.check_fence()
        except FenceError as exc:
            return str(exc)
        return ""

    def _guarded(
        self,
        step: int,
        payloads: dict[str, LayerPayload],
        manifest: dict[str, Any] | None,
        done: Callable[[], None] | None,
    ) -> None:
        try:
            self._write(step, payloads, manifest)
        except BaseException as exc:
            self._error = exc
        finally:
            self._files_written.set()
            if done is not None:
                done()

    def _write(self, step: int, payloads: dict[str, LayerPayload], manifest: dict[str, Any] | None) -> None:
        directory = step_dir(self.root, step, self.generation)
        try:
            self._write_files(step, directory, payloads, manifest)
        except FenceError:
            if not (directory / MANIFEST).exists():
                shutil.rmtree(directory, ignore_errors=True)  # this generation's own unfinished directory
            raise
        except OSError as exc:
            if not (directory / MANIFEST).exists():
                shutil.rmtree(directory, ignore_errors=True)
            try:
                self.check_fence()  # a newer generation may have fenced this one and removed its files mid-write
            except FenceError as fenced:
                raise fenced from exc
            kept = f"step {self.last_committed}" if self.last_committed is not None else "none written by this run"
            raise CheckpointWriteFailed(
                f"checkpoint step {step} could not be written to {self.root}: {exc.strerror or exc}; "
                f"its partial files were removed and the previous checkpoint ({kept}) is kept; "
                "free space or point the job at another checkpoint_dir"
            ) from exc

    def _write_files(
        self, step: int, directory: Path, payloads: dict[str, LayerPayload], manifest: dict[str, Any] | None
    ) -> None:
        started = time.perf_counter()
        self.check_fence()  # a fenced-off generation writes nothing more
        parts = directory / ".parts"
        parts.mkdir(parents=True, exist_ok=True)
        entries = write_layer_files(directory, payloads, self.rank)
        self._files_written.set()
        self.bytes_written += sum(e["bytes"] for e in entries)
        part = {"generation": self.generation, "rank": self.rank, "files": entries}
        try:
            atomic_write(parts / part_name(self.generation, self.run_id, self.rank), json.dumps(part).encode())
        except FileNotFoundError:
            # Rank 0 read this part once it was renamed into place, committed the step and removed .parts while
            # this rank was still syncing that directory: the step is committed, nothing was lost. Without the
            # manifest the directory went for another reason (a newer generation's cleanup), and that fails.
            if not (directory / MANIFEST).exists():
                raise
        if manifest is not None:
            self._commit(step, directory, parts, manifest)
        self.seconds_writing += time.perf_counter() - started

    def _commit(self, step: int, directory: Path, parts: Path, manifest: dict[str, Any]) -> None:
        deadline = time.monotonic() + self.timeout
        names = [parts / part_name(self.generation, self.run_id, r) for r in range(self.world_size)]
        while not all(p.exists() for p in names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint step {step}: not every rank wrote its part in {self.timeout}s")
            time.sleep(0.02)
        files = sorted((e for p in names for e in _part_entries(p, self.generation)), key=lambda e: e["path"])
        body = {
            "format": FORMAT,
            **manifest,
            "generation": self.generation,
            "step": step,
            "files": files,
            "committed_at": time.time(),
        }
        data = json.dumps(body, indent=1, sort_keys=True).encode()
        atomic_write(directory / MANIFEST, data, before_rename=self.check_fence)
        shutil.rmtree(parts, ignore_errors=True)
        self.last_committed = step
        self._prune(step)

    def _prune(self, committed: int) -> None:
        """Keep the newest ``keep`` committed checkpoints up to ``committed`` of this and older generations; never
        touch a newer generation's directories; a fenced run also drops what older generations wrote past the
        step it resumed from (the controller never committed those), and keeps every checkpoint from the newest
        one the controller acknowledged on (a run cut off from the controller must not delete the checkpoint
        the next generation will resume from)."""
        for leftover in self.root.glob(f"{TRASH}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        floor = None
        if self.fence is not None:
            floor = max(self.resumed_from, self.acknowledged() if self.acknowledged is not None else 0)
        valid = 0
        for step, generation, path in checkpoint_dirs(self.root):
            if generation > self.generation:
                continue
            stale = self.fence is not None and generation < self.generation and step > self.resumed_from
            if not stale and step > committed:
                continue
            has_manifest = (path / MANIFEST).exists()
            if has_manifest and not self._ours(path):
                continue  # another job's (or one this cannot read): never deleted, never counted
            if not stale and has_manifest and (valid < self.keep or (floor is not None and step >= floor)):
                valid += 1
                continue
            self._remove(path)

    def _ours(self, path: Path) -> bool:
        """Whether the committed checkpoint at ``path`` is this job's (its manifest's ``job_hash``)."""
        if self.job_hash is None:
            return True
        try:
            manifest = load_json_bounded(path / MANIFEST, MAX_MANIFEST_BYTES)
        except (OSError, HostileFile):
            return False
        return isinstance(manifest, dict) and manifest.get("job_hash") == self.job_hash

    def _remove(self, path: Path) -> None:
        self.check_fence()  # right before each deletion: a newer generation may be loading what is here
        trash = path.with_name(f"{TRASH}{path.name}-{os.getpid()}")
        try:
            path.rename(trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)


def load_part(path: Path) -> Any:
    """Another rank's part of a checkpoint on the share, read as the hostile file it may be."""
    try:
        return load_json_bounded(path, MAX_MANIFEST_BYTES)
    except (OSError, HostileFile) as exc:
        raise CheckpointWriteFailed(f"a rank's part of the checkpoint is unreadable: {exc}") from None


def part_files(files: Any, path: Path) -> list[dict[str, Any]]:
    """The file entries a part lists (the manifest checks them in full when it is read)."""
    if not isinstance(files, list) or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in files):
        raise CheckpointWriteFailed(f"{path}: not a part of a checkpoint (its files are not a list of file entries)")
    return files


def _part_entries(path: Path, generation: int) -> list[dict[str, Any]]:
    part = load_part(path)
    if not isinstance(part, dict):
        raise CheckpointWriteFailed(f"{path}: not a part of a checkpoint (a JSON object with its files)")
    if part.get("generation") != generation:
        raise CheckpointWriteFailed(f"{path}: a part of generation {part.get('generation')}, not of {generation}")
    return part_files(part.get("files"), path)
