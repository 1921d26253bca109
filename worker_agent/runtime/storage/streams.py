"""Layer files streamed to and from the disk, hashed on the way, several at once (torch-free).

Writing: :class:`HashingWriter` is the file object ``torch.save`` writes into; every chunk it is handed (a
view of a tensor's storage, or a header) is hashed and passed on to the file, so no serialised copy of a
layer is ever held in memory. Reading: :func:`hash_read` reads a file in bounded chunks, hashing each, and
never past the size it was told; :func:`sealed_copy` also copies what it hashed into a sealed ``memfd``
(Linux), a private snapshot that nothing can change any more, which ``torch.load(mmap=True)`` then maps: the
tensors loaded are views of exactly the bytes that were verified, however the file on the share changes
afterwards, and they own that memory (no file on the share stays mapped). :func:`in_parallel` runs one of
these per file on a few threads: ``hashlib``, ``xxhash`` and file I/O release the GIL.

The checksum is XXH3-128 (:data:`XXH3`, format v3): it guards against torn, truncated and mixed-up files,
not an adversary (whoever can write a layer file can write its manifest), and at about 10 GB/s a core it
is no longer what bounds a read (``bench/checkpoint_io_bench.py``: about half the raw disk's rate here,
the copy into the sealed snapshot and ``torch.load`` the rest), where SHA-256 (formats v1 and v2, still
read) ran at about 1.1 GB/s and, every file hashed twice on a resume, held the read to a third of the raw
disk's rate.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from functools import partial
from typing import BinaryIO, Protocol, TypeVar

import xxhash

from worker_agent.runtime.errors import CheckpointError

CHUNK = 1 << 20  # read and hashed at a time: stays in the CPU's cache between the read and the hash
WORKERS = min(4, os.cpu_count() or 1)  # files written or read at once
T = TypeVar("T")
R = TypeVar("R")
XXH3 = "xxh3_128"  # what format v3 writes
SHA256 = "sha256"  # formats v1 and v2


class Hasher(Protocol):
    def update(self, data: memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


HASHERS: dict[str, Callable[[], Hasher]] = {XXH3: xxhash.xxh3_128, SHA256: hashlib.sha256}
SHOWN = {XXH3: "checksum (XXH3-128)", SHA256: "SHA-256"}  # how messages name them


class HashingWriter:
    """A write-only file object: every byte written goes on to ``out``, hashed (XXH3-128) and counted."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.hash = HASHERS[XXH3]()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        with memoryview(data) as view:
            self.hash.update(view)
            self.out.write(view)
            self.size += view.nbytes
            return view.nbytes

    def flush(self) -> None:
        self.out.flush()

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


def hash_read(
    fd: int, size: int, where: str, sink: Callable[[memoryview], object] | None = None, algorithm: str = XXH3
) -> str:
    """The ``algorithm`` hash (hex) of the file open as ``fd``, read in chunks of at most :data:`CHUNK` bytes
    and never more than ``size`` + 1 (one more shows that it grew); ``sink`` is handed each chunk as it is
    hashed.

    A read error, or a file of another size than ``size`` by the end, is a :class:`CheckpointError` naming
    ``where``; an error of ``sink`` is not (it says nothing about the file) and passes through."""
    h = HASHERS[algorithm]()
    buf = bytearray(max(1, min(CHUNK, size)))
    got = 0
    with memoryview(buf) as view:
        while got <= size:
            want = min(len(buf), size - got) or 1  # past the size: one byte, to see whether there is one
            try:
                count = os.readv(fd, [view[:want]])
            except OSError as exc:
                raise CheckpointError(f"{where}: {exc.strerror or exc}") from exc
            if not count:
                break
            got += count
            if got > size:
                break
            with view[:count] as chunk:
                h.update(chunk)
                if sink is not None:
                    sink(chunk)
    if got != size:
        raise CheckpointError(f"{where}: changed size while being read ({got} bytes, was {size})")
    return h.hexdigest()


def can_seal() -> bool:
    """Whether :func:`sealed_copy` makes a sealed memfd here (Linux, with /proc); else it copies to bytes."""
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS") and os.path.isdir("/proc/self/fd")


@contextmanager
def sealed_copy(fd: int, size: int, where: str, expected: tuple[str, str]) -> Iterator[str | io.BytesIO]:
    """A private snapshot of the file open as ``fd``, read once (:func:`hash_read`), whose hash must be
    ``expected`` (algorithm, hex; else a :class:`CheckpointError` naming ``where``): the path of a sealed memfd
    (``/proc/self/fd/N``, for ``torch.load(..., mmap=True)``; a mapping of it outlives the descriptor, which
    is closed on leaving), or where there is no memfd, the bytes themselves in a :class:`io.BytesIO`."""
    memfd = _memfd() if can_seal() else None
    if memfd is None:
        data = io.BytesIO()
        check_hash(hash_read(fd, size, where, data.write, expected[0]), expected, where)
        data.seek(0)
        yield data
        return
    try:
        check_hash(hash_read(fd, size, where, partial(_write_all, memfd), expected[0]), expected, where)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, seals)  # from here on nobody can change, grow or shrink it
        yield f"/proc/self/fd/{memfd}"
    finally:
        os.close(memfd)


def check_hash(digest: str, expected: tuple[str, str], where: str) -> None:
    """``digest`` is the manifest's ``expected`` (algorithm, hex), or a :class:`CheckpointError` naming ``where``."""
    if digest != expected[1]:
        raise CheckpointError(f"{where}: {SHOWN[expected[0]]} does not match the manifest")


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _memfd() -> int | None:
    try:
        return os.memfd_create("spotmorph-layer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None


def in_parallel(work: Callable[[T], R], items: Sequence[T], workers: int = WORKERS) -> list[R]:
    """``[work(item) for item in items]`` on up to ``workers`` threads. Once one raises, the items not yet
    started are dropped and, after every started one is over, the first error (in ``items`` order) is
    raised: nothing is still writing or reading when the caller cleans up."""
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="layer-io") as pool:
        futures = [pool.submit(work, item) for item in items]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            future.cancel()
    for future in futures:
        error = None if future.cancelled() else future.exception()
        if error is not None:
            raise error
    return [future.result() for future in futures]
