"""Files with the modes they need whatever the process umask says: secrets 0600, their folders 0700.

A umask of 022 leaves a new SQLite database world-readable, one of 000 leaves folders world-writable;
so modes are set explicitly (``os.open`` with a mode, then ``fchmod``), never left to the umask. Writes
go to a private temporary file renamed into place: a reader never sees half a token, nor a moment when
the file is readable by others.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PUBLIC_FILE = 0o644

log = logging.getLogger("spotmorph.files")


def private_dir(path: Path) -> None:
    """Create ``path`` 0700 (missing parents as the umask says), or make an existing one 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    set_mode(path, PRIVATE_DIR)


def private_file(path: Path) -> None:
    """Create ``path`` empty and 0600 when missing, or make an existing one 0600 (a database before it opens)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE))
    set_mode(path, PRIVATE_FILE)


def set_mode(path: Path, mode: int) -> None:
    """Give ``path`` exactly ``mode``; warn when it had let others in, since they may have read it already."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current == mode:
        return
    os.chmod(path, mode)
    if current & ~mode & 0o077:
        log.warning("%s was mode %03o, open to other users; it is %03o now", path, current, mode)


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, mode 0600 (tokens, secrets, private keys)."""
    _write(path, data, PRIVATE_FILE)


def write_public(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, mode 0644 (certificates, addresses)."""
    _write(path, data, PUBLIC_FILE)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(tmp, flags, PRIVATE_FILE), "wb") as out:
            os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
