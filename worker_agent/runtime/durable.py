"""Writing a file so that a reader sees all of it or none of it, even across a crash (torch-free).

Temp file beside the target, fsync, rename over the target, fsync the directory. ``before_rename`` runs
between the fsync and the rename: the checkpoint writer checks its generation's fence there, so a
generation the controller has moved past never makes a manifest appear.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, before_rename: Callable[[], None] | None = None) -> None:
    """Write ``data`` to a temp file, fsync it, rename it over ``path`` and fsync the directory.

    When ``before_rename`` raises, the temp file is removed and ``path`` is left as it was."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
