"""One controller per state directory: an exclusive ``flock`` on STATE_DIR/controller.lock.

Two controllers on one SQLite file would each decide on their own copy of the world (split brain).
The kernel drops the lock when its process dies, even by SIGKILL, so a crashed controller never leaves
a stale lock behind; the pid written into the file only names the holder in the second one's error.
The descriptor is not inheritable, so agents the controller starts do not keep the lock alive.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from controller.files import private_dir
from morphing.errors import UserInputError

LOCK_FILE = "controller.lock"


class StateDirInUse(UserInputError):
    """Another controller holds the state directory; ``str()`` names the directory and its pid."""


class StateDirLock:
    """Held from :func:`lock_state_dir` until :meth:`release` (or the process ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # while still held: a successor's pid is never erased
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def lock_state_dir(state_dir: Path) -> StateDirLock:
    """Take the directory (made 0700: it holds the tokens) or raise :class:`StateDirInUse` (exit code 2)."""
    try:
        private_dir(state_dir)
    except OSError as exc:
        raise UserInputError(
            f"--state-dir {state_dir}: cannot create it or make it private ({exc.strerror or exc}); "
            "use a directory this user owns"
        ) from None
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # no O_TRUNC: the holder's pid is read below
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StateDirInUse(
            f"--state-dir {state_dir}: a controller (pid {holder}) is running on it; stop it or use another directory"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateDirLock(path, fd)
