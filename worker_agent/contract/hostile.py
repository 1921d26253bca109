"""Reading a file that someone else can write: the one way the agent and the trainers open such a file.

The checkpoint share, the control dir and the user's data files can hold anything: a FIFO (an ``open()``
that never returns), a device (endless bytes), a symbolic link, a file of gigabytes, JSON nested until the
parser's recursion runs out, ``NaN`` or a number of 400 digits. :func:`read_bounded` opens without
blocking (``O_NONBLOCK``), refuses what is not a regular file and reads at most its bound;
:func:`parse_json_bounded` refuses deep nesting before the parser sees it, and numbers that are not
finite or do not fit 64 bits. Each refusal is a :class:`HostileFile` naming the file and what is wrong,
which the caller turns into its own error (a user error, a damaged fence, a lapsed lease). Torch-free.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

MAX_DEPTH = 32  # no file of the contract nests deeper than a few levels
MAX_INT = 1 << 63  # what any counter, step, size or id of the contract fits in
_STRUCTURE = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
}


class HostileFile(ValueError):
    """A file that is not what it must be: no regular file, larger than its bound, or not bounded JSON."""


def open_regular(
    path: Path | str, *, dir_fd: int | None = None, follow_symlinks: bool = False, what: str | None = None
) -> int:
    """A read-only descriptor of ``path``, which must be a regular file; opening never blocks (a FIFO).
    Messages name the file as ``what`` (default: ``path``).

    ``FileNotFoundError`` passes through (most callers read a missing file as "none yet")."""
    name = str(path) if what is None else what
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostileFile(f"{name}: is a symbolic link; it must be the file itself (copy, not link it)") from None
        if exc.errno == errno.ENXIO:
            raise HostileFile(f"{name}: is not a regular file (a socket); it must be a file") from None
        raise HostileFile(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
    except OSError as exc:
        os.close(fd)
        raise HostileFile(f"cannot read {name}: {exc.strerror or exc}") from None
    if kind != stat.S_IFREG:
        os.close(fd)
        raise HostileFile(f"{name}: is not a regular file ({_KINDS.get(kind, 'unknown kind')}); it must be a file")
    return fd


def read_bounded(
    path: Path | str, max_bytes: int, *, dir_fd: int | None = None, follow_symlinks: bool = False
) -> bytes:
    """The bytes of the regular file ``path``; :class:`HostileFile` when it is none or holds more than
    ``max_bytes`` (read at most one byte past the bound, however large the file claims or grows to be)."""
    fd = open_regular(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise HostileFile(f"{path}: {size} bytes, more than such a file may hold ({max_bytes})")
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise HostileFile(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if got > max_bytes:
        raise HostileFile(f"{path} grew past the {max_bytes} bytes such a file may hold while it was read")
    return b"".join(chunks)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is out of range")
    return value


def _int64(text: str) -> int:
    if len(text) > 20 or not -MAX_INT <= (value := int(text)) < MAX_INT:
        raise ValueError(f"the number {text[:20]}... does not fit 64 bits")
    return value


def _not_finite(text: str) -> float:
    raise ValueError(f"{text} is not a finite number")


def parse_json_bounded(data: bytes | str, what: str, max_depth: int = MAX_DEPTH, *, finite: bool = True) -> Any:
    """``data`` as JSON, nested at most ``max_depth`` deep, every number finite and within 64 bits;
    :class:`HostileFile` naming ``what`` otherwise. ``finite=False`` lets ``NaN`` and ``Infinity`` through
    (a progress line reports a diverged loss as NaN)."""
    raw = data.encode() if isinstance(data, str) else data
    depth = 0
    for found in _STRUCTURE.finditer(raw):
        bracket = found.group()
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > max_depth:
                raise HostileFile(f"{what} nests deeper than {max_depth} levels; it is not such a file")
        elif bracket in (b"]", b"}"):
            depth -= 1
    try:
        if not finite:
            return json.loads(raw, parse_int=_int64)
        return json.loads(raw, parse_float=_finite, parse_int=_int64, parse_constant=_not_finite)
    except (ValueError, RecursionError) as exc:
        raise HostileFile(f"{what} is not valid JSON ({str(exc)[:100]})") from None


def load_json_bounded(path: Path | str, max_bytes: int, *, follow_symlinks: bool = False) -> Any:
    """:func:`read_bounded` then :func:`parse_json_bounded`."""
    return parse_json_bounded(read_bounded(path, max_bytes, follow_symlinks=follow_symlinks), str(path))


def read_counter(path: Path | str, max_bytes: int = 32) -> int:
    """A file holding one integer >= 0 that fits 64 bits (a request counter, an acknowledged step)."""
    text = read_bounded(path, max_bytes).decode(errors="replace").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19 or int(text) >= MAX_INT:
        raise HostileFile(f"{path} holds {text[:20]!r}, not a counter (an integer from 0 to 2**63 - 1)")
    return int(text)
