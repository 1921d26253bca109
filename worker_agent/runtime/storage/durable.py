"""Writing a file so that a reader sees all of it or none of it, even across a crash (torch-free).

Temp file beside the target, fsync, rename over the target, fsync the directory; what is written may be
streamed into the temp file (:func:`atomic_write_stream`) rather than held whole in memory first.
``before_rename`` runs between the fsync and the rename: the checkpoint writer checks its generation's
fence there, so a generation the controller has moved past never makes a manifest appear.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

T = TypeVar("T")
BUFFER = 1 << 20  # small writes (zip headers, the pickle) gathered into one system call


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, before_rename: Callable[[], None] | None = None) -> None:
    """Write ``data`` to a temp file, fsync it, rename it over ``path`` and fsync the directory.

    When ``before_rename`` raises, the temp file is removed and ``path`` is left as it was."""
    atomic_write_stream(path, lambda fh: fh.write(data), before_rename)


def atomic_write_stream(
    path: Path, produce: Callable[[BinaryIO], T], before_rename: Callable[[], None] | None = None
) -> T:
    """:func:`atomic_write` of what ``produce`` writes into the temp file (buffered: small writes are
    gathered, large ones go straight to the file), so nothing needs to be held whole in memory first;
    what ``produce`` returns.

    When ``produce``, the fsync or ``before_rename`` raises, the temp file is removed and ``path`` is left
    as it was."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb", buffering=BUFFER) as fh:
            produced = produce(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
    return produced
