"""Waiting in a spool for an assignment, as a warm trainer or a trainer holding its state does."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from worker_agent.contract import WarmAssignment, WarmSpool
from worker_agent.contract.hostile import HostileFile, read_bounded

POLL_SECONDS = 0.02
MAX_ASSIGNMENT_BYTES = 1 << 20


def wait_for_assignment(
    spool: WarmSpool, parent: int, deadline: float | None = None, prepare: Callable[[str], None] | None = None
) -> WarmAssignment | None:
    """The assignment handed over in ``spool``; None once the agent that started us is gone, or took the spool
    away (it gave this process up), or at ``deadline``.
    Meanwhile ``prepare`` is called with each new job the agent hands it to get ready for (its spec's JSON)."""
    prepared, seen = "", (0, 0)  # the job last prepared, and the file it was read from (inode, mtime)
    while not spool.assigned():
        if os.getppid() != parent or not spool.path.is_dir():
            return None
        if deadline is not None and time.monotonic() > deadline:
            return None
        if prepare is not None and (handed := _handed(spool)) not in (None, seen):
            seen = handed  # the agent replaces the file whole (a rename): read it only when it is a new one
            try:  # only a hint: one that cannot be read is not prepared, and the wait goes on
                job = read_bounded(spool.prepare_file, MAX_ASSIGNMENT_BYTES).decode(errors="replace")
            except (OSError, HostileFile):
                job = prepared
            if job != prepared:
                prepared = job
                prepare(job)
                spool.mark_prepared(job)  # built or not: the agent stops reporting it as being built
                continue
        time.sleep(POLL_SECONDS)
    return WarmAssignment.from_json(read_bounded(spool.assignment_file, MAX_ASSIGNMENT_BYTES).decode())


def _handed(spool: WarmSpool) -> tuple[int, int] | None:
    """Which prepare file the spool holds (its inode and mtime), None for none."""
    try:
        status = spool.prepare_file.stat()
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns


def take_over(task: WarmAssignment) -> None:
    """Point stdout and stderr at the assigned trainer's log."""
    append_output_to(task.log_file)


def append_output_to(path: str | Path, fds: tuple[int, ...] = (1, 2)) -> None:
    """Point ``fds`` (stdout and stderr) at the end of the file ``path``, after what Python buffered for them."""
    sys.stdout.flush()
    sys.stderr.flush()
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in fds:
        os.dup2(opened, fd)
    os.close(opened)
