"""A checkpoint's ``manifest.json`` and layer files, read as untrusted input.

A checkpoint directory may be damaged, copied from another job or written by someone hostile, so nothing
in a manifest is believed before it is checked: a strict schema (types, no missing or unknown fields), a
``job_hash`` that is the hash of the recorded ``job``, the step (and, from format v2 on, the generation) of
its own ``step-*`` directory, and file entries that are plain ``LAYER.pt`` names inside that directory.
Files are opened through the directory's descriptor without following links, only when fstat shows a
regular file of the declared size, and never read past it; a layer file is hashed as it is read, in
bounded chunks, and loaded from a sealed private copy of exactly the bytes that were hashed. Every
problem is a :class:`CheckpointError`: readers treat it as a damaged checkpoint.
"""

from __future__ import annotations

import io
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from morphing.jobspec import identity_hash
from worker_agent.contract.hostile import HostileFile, open_regular
from worker_agent.runtime.errors import CheckpointError, ForeignCheckpoint
from worker_agent.runtime.storage.streams import SHA256, XXH3, check_hash, hash_read, sealed_copy

MANIFEST = "manifest.json"
# v2: the directory is named by step and writer generation (step-NNNNNNNN-gG; generation 0, a standalone run,
# keeps the v1 name step-NNNNNNNN) and the manifest's generation must be the directory's. v3: each file's
# checksum is XXH3-128 (``xxh3_128``), not SHA-256 (``sha256``; :mod:`worker_agent.runtime.storage.streams` says why).
# v1 and v2 still load.
FORMAT_V1 = "spotmorph.checkpoint/v1"
FORMAT_V2 = "spotmorph.checkpoint/v2"
FORMAT = "spotmorph.checkpoint/v3"
FORMATS = (FORMAT_V1, FORMAT_V2, FORMAT)
STEP_DIR = re.compile(r"^step-(\d{8,})(?:-g([1-9]\d*))?$")
# Far above any real manifest (an entry is a few hundred bytes plus its tensor names), far below memory.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_ERRORS_SHOWN = 3

Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Xxh3 = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class JobIdentity(_Strict):
    """What defines a job's result (``JobSpec.identity()``): only the same job resumes a checkpoint."""

    entrypoint: str
    global_batch: Count
    seed: int
    dtype: str
    exact: bool | None = None  # only an exact job's identity names these
    micro_batch_size: Count | None = None


class LossScaleState(_Strict):
    """fp16's loss scale (:mod:`worker_agent.runtime.numerics.loss_scale`), the same on every rank."""

    scale: float = Field(gt=0)
    good_steps: Count


class DataCursor(_Strict):
    samples_consumed: Count
    epoch: Count
    offset: Count


class FileEntry(_Strict):
    """One layer file: ``path`` is ``LAYER.pt``, directly inside the step directory."""

    path: str
    layer: str = Field(min_length=1)
    size: Count = Field(alias="bytes")
    sha256: Sha256 | None = None  # formats v1 and v2
    xxh3_128: Xxh3 | None = None  # format v3
    tensors: tuple[str, ...]
    writer_rank: Count

    @field_validator("path")
    @classmethod
    def _inside_step_dir(cls, path: str) -> str:
        if "\x00" in path:
            raise ValueError(f"path {path!r} holds a NUL byte")
        if path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
            raise ValueError(f"path {path!r} is absolute; a manifest names only files inside its own step directory")
        parts = re.split(r"[/\\]", path)
        if ".." in parts:
            raise ValueError(
                f"path {path!r} climbs out with '..'; a manifest names only files inside its step directory"
            )
        if len(parts) > 1:
            raise ValueError(f"path {path!r} is not a plain file name; layer files lie directly in the step directory")
        return path

    @model_validator(mode="after")
    def _named_after_layer(self) -> FileEntry:
        if self.path != f"{self.layer}.pt":
            raise ValueError(f"path {self.path!r} is not the file of layer {self.layer!r} ({self.layer}.pt)")
        if (self.sha256 is None) == (self.xxh3_128 is None):
            raise ValueError(f"file {self.path!r} must name exactly one checksum, xxh3_128 (format v3) or sha256")
        return self

    @property
    def checksum(self) -> tuple[str, str]:
        """(algorithm, hex) as :mod:`worker_agent.runtime.storage.streams` names them."""
        return (XXH3, self.xxh3_128) if self.xxh3_128 is not None else (SHA256, self.sha256 or "")


class Manifest(_Strict):
    """``manifest.json`` as ``CheckpointWriter`` commits it (formats v1 to v3)."""

    format: str
    step: Count
    job_hash: Sha256
    job: JobIdentity
    files: tuple[FileEntry, ...]
    committed_at: float
    data_cursor: DataCursor
    layout: dict[str, Any]
    generation: int
    layer_names: tuple[str, ...]
    loss_scale: LossScaleState | None = None  # written by fp16 runs only, so other manifests keep their bytes

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in FORMATS:
            raise ValueError(
                f"unknown format {value!r}; this spotmorph reads {' and '.join(FORMATS)} (a newer one wrote it?)"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if identity_hash(self.job.model_dump(exclude_none=True)) != self.job_hash:
            raise ValueError("job_hash is not the hash of job: the manifest was edited or mixed from two jobs")
        paths = Counter(f.path for f in self.files)
        tensors = Counter(t for f in self.files for t in f.tensors)
        for kind, counts in (("file", paths), ("tensor", tensors)):
            twice = sorted(name for name, count in counts.items() if count > 1)
            if twice:
                raise ValueError(f"{kind} {twice[0]!r} is listed more than once")
        if sorted(f.layer for f in self.files) != sorted(self.layer_names):
            raise ValueError("files do not hold exactly one file per layer of layer_names")
        algorithm = XXH3 if self.format == FORMAT else SHA256
        if any(f.checksum[0] != algorithm for f in self.files):
            raise ValueError(f"a {self.format} manifest gives every file's checksum as {algorithm}")
        return self

    def describe_job(self, hash_digits: int = 12) -> str:
        return describe_job(self.job.model_dump(exclude_none=True), self.job_hash, hash_digits)


def describe_job(identity: Mapping[str, Any] | None, job_hash: str, hash_digits: int = 12) -> str:
    """``entrypoint=..., global_batch=..., seed=..., dtype=...; job_hash 0123456789ab`` for messages."""
    fields = ", ".join(f"{key}={value}" for key, value in (identity or {}).items())
    short = f"job_hash {job_hash[:hash_digits]}"
    return f"{fields}; {short}" if fields else short


def _explain(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if any(e["type"] in ("json_invalid", "string_unicode") for e in errors):
        return f"unreadable manifest ({errors[0]['msg']})"
    shown = []
    for e in errors[:_ERRORS_SHOWN]:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        message = str(e["msg"]).removeprefix("Value error, ")
        shown.append(f"{where}: {message}" if where else message)
    more = f" (and {len(errors) - _ERRORS_SHOWN} more)" if len(errors) > _ERRORS_SHOWN else ""
    return "invalid manifest: " + "; ".join(shown) + more


@contextmanager
def step_directory(path: Path) -> Iterator[int]:
    """A descriptor of the step directory itself; a symbolic link (to a directory anywhere) is refused."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            raise CheckpointError(
                f"{path.name}: is a symbolic link to {os.readlink(path)}; a checkpoint must be a real directory "
                "in its checkpoint root (copy it rather than linking it)"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise CheckpointError(f"{path.name}: is not a directory")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CheckpointError(f"{path.name}: {exc.strerror or exc}") from exc
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _opened(dir_fd: int, where: str, name: str, expected: int | None) -> Iterator[tuple[int, int]]:
    """``name`` in ``dir_fd`` open, and its size: a regular file (no link, opened by :func:`open_regular`, so
    a FIFO never blocks) of ``expected`` bytes by fstat (``None``: of at most a manifest's bound), checked
    before a byte is read."""
    try:
        fd = open_regular(name, dir_fd=dir_fd, what=where)
    except HostileFile as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"{where}: {exc.strerror or exc}") from exc
    try:
        try:
            size = os.fstat(fd).st_size
        except OSError as exc:
            raise CheckpointError(f"{where}: {exc.strerror or exc}") from exc
        if expected is not None and size != expected:
            raise CheckpointError(f"{where}: {size} bytes, manifest says {expected}")
        if size > MAX_MANIFEST_BYTES and expected is None:
            raise CheckpointError(f"{where}: {size} bytes, more than any manifest ({MAX_MANIFEST_BYTES})")
        yield fd, size
    finally:
        os.close(fd)


def _read(dir_fd: int, where: str, name: str) -> bytearray:
    """A manifest's bytes (:func:`_opened`), never read past the size fstat gave."""
    with _opened(dir_fd, where, name, None) as (fd, size), io.FileIO(fd, "rb", closefd=False) as fh:
        try:
            data = _read_at_most(fh, size + 1)
        except OSError as exc:
            raise CheckpointError(f"{where}: {exc.strerror or exc}") from exc
    if len(data) != size:
        raise CheckpointError(f"{where}: changed size while being read ({len(data)} bytes, was {size})")
    return data


def _read_at_most(fh: io.FileIO, limit: int) -> bytearray:
    buf = bytearray(limit)
    got = 0
    with memoryview(buf) as view:
        while got < limit:
            count = fh.readinto(view[got:])
            if not count:
                break
            got += count
    del buf[got:]
    return buf


def parse_manifest(path: Path, dir_fd: int) -> Manifest:
    """The manifest of the step directory ``path`` (open as ``dir_fd``), checked against the schema."""
    try:
        os.stat(MANIFEST, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise CheckpointError(f"{path.name}: no {MANIFEST} (incomplete write)") from None
    except OSError:
        pass  # _read names it
    data = _read(dir_fd, f"{path.name}/{MANIFEST}", MANIFEST)
    try:
        manifest = Manifest.model_validate_json(data)
    except ValidationError as exc:
        raise CheckpointError(f"{path.name}: {_explain(exc)}") from None
    named = parse_dir_name(path.name)
    if named is not None and named[0] != manifest.step:
        raise CheckpointError(f"{path.name}: manifest says step {manifest.step}, not this directory's step")
    if named is not None and manifest.format != FORMAT_V1 and named[1] != manifest.generation:
        raise CheckpointError(
            f"{path.name}: manifest says generation {manifest.generation}, not this directory's generation "
            f"{named[1]} (moved or copied under another generation's name?)"
        )
    return manifest


def dir_name(step: int, generation: int = 0) -> str:
    """The directory of the checkpoint of ``step`` written by ``generation``; two generations never share one."""
    return f"step-{step:08d}" if generation == 0 else f"step-{step:08d}-g{generation}"


def parse_dir_name(name: str) -> tuple[int, int] | None:
    """``(step, generation)`` of a checkpoint directory's name (a v1 name is generation 0); None for others."""
    found = STEP_DIR.match(name)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2) or 0)


def check_job(path: Path, manifest: Manifest, job: Mapping[str, Any] | str) -> None:
    """Refuse another job's checkpoint; ``job`` is this job's identity (``JobSpec.identity()``) or its hash."""
    ours = job if isinstance(job, str) else identity_hash(dict(job))
    if manifest.job_hash != ours:
        this = describe_job(None if isinstance(job, str) else job, ours)
        raise ForeignCheckpoint(
            f"{path.name}: belongs to another job ({manifest.describe_job()}), not to this one ({this})"
        )


def verify_file(dir_fd: int, path: Path, entry: FileEntry) -> None:
    """One layer file of the step directory ``path`` checked against its manifest entry: read in bounded
    chunks and hashed on the way (:func:`~worker_agent.runtime.storage.streams.hash_read`), nothing kept."""
    where = f"{path.name}/{entry.path}"
    with _opened(dir_fd, where, entry.path, entry.size) as (fd, size):
        check_hash(hash_read(fd, size, where, algorithm=entry.checksum[0]), entry.checksum, where)


@contextmanager
def verified_copy(path: Path, entry: FileEntry) -> Iterator[str | io.BytesIO]:
    """A private, sealed copy of one layer file of the step directory ``path``, read once and checked
    against its manifest entry on the way (:func:`~worker_agent.runtime.storage.streams.sealed_copy`): what
    ``torch.load`` reads from it are exactly the bytes that were verified, whatever happens to the file."""
    where = f"{path.name}/{entry.path}"
    with (
        step_directory(path) as dir_fd,
        _opened(dir_fd, where, entry.path, entry.size) as (fd, size),
        sealed_copy(fd, size, where, entry.checksum) as copy,
    ):
        yield copy
