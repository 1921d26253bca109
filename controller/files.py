"""Files with the modes they need whatever the process umask says: secrets 0600, their folders 0700.

A umask of 022 leaves a new SQLite database world-readable, one of 000 leaves folders world-writable;
so modes are set explicitly (``os.open`` with a mode, then ``fchmod``), never left to the umask. Writes
go to a private temporary file renamed into place: a reader never sees half a token, nor a moment when
the file is readable by others.

Files named by a flag (certificates, keys, tokens, configs) are read by :func:`read_small` only: a
regular file of bounded size, so ``/dev/zero`` or a FIFO is one line naming the flag, never a process
that grows until it is killed or waits forever.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from morphing.errors import UserInputError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PUBLIC_FILE = 0o644

KIB = 1 << 10
TOKEN_LIMIT = 64 * KIB  # a token or secret is tens of bytes
PEM_LIMIT = 1 << 20  # a certificate chain or CA bundle (the system bundle is ~200 KiB)
CONFIG_LIMIT = 1 << 20  # a YAML of settings, a template, a unit file

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


def read_small(path: Path, flag: str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` of at most ``limit`` bytes; UserInputError naming ``flag`` otherwise.

    Opened with O_NONBLOCK so a FIFO without a writer cannot block the open, checked with ``fstat`` on
    that descriptor (what is read is what was checked), and read up to ``limit + 1`` bytes so a file
    that grows meanwhile is still refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserInputError(
            f"{flag} {path}: cannot read it ({exc.strerror or exc}); check the path and that this user may read it"
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UserInputError(f"{flag} {path}: not a regular file (a {_kind(mode)}); pass the path of a file on disk")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise UserInputError(f"{flag} {path}: cannot read it ({exc.strerror or exc}); check the file") from None
    if len(data) > limit:
        raise UserInputError(
            f"{flag} {path}: larger than {limit} bytes, more than such a file holds; pass the right file"
        )
    return data


def read_small_text(path: Path, flag: str, limit: int) -> str:
    """:func:`read_small` as UTF-8 text; bytes that are not UTF-8 are a UserInputError naming ``flag``."""
    data = read_small(path, flag, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(
            f"{flag} {path}: not UTF-8 text (byte {exc.start}); pass a text file (PEM, YAML or a token)"
        ) from None


_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "special file")
