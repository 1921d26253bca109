"""Zygotes for the supervisors a test drives in its pytest worker (the ``node_zygote`` fixture, tests/conftest.py).

A supervisor that forks its trainers from a zygote (a CPU node's, :mod:`worker_agent.agent.zygote`) starts each as a
fork of a process that imported torch once, not as a new interpreter that imports it again (3-4 s of CPU each on
the 2-core machines the suite runs on). The zygote comes forked from the worker's fork server (tests/forkserver.py:
a zygote's imports, no user code), so it costs no import either; the supervisor adopts it as an agent adopts the
one its local VM forked. The supervisor makes its process a child subreaper (the zygote's forks are adopted by it):
for a pytest worker only while the test runs, or it would adopt every daemon a later test leaves behind.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests import forkserver_client
from worker_agent.agent.zygote import INHERITED_ENV, PR_SET_CHILD_SUBREAPER, InheritedProcess, become_subreaper


@contextmanager
def zygotes(folder: Path) -> Iterator[Callable[[], InheritedProcess | None]]:
    """Within: this process is a child subreaper, and each call is a zygote it adopted (None without the fork
    server, or where this process cannot adopt: the supervisor then starts a zygote of its own); every zygote
    handed out is ended on the way out."""
    handed: list[InheritedProcess] = []
    adopts = become_subreaper()

    def one() -> InheritedProcess | None:
        if not (adopts and forkserver_client.enabled()):
            return None
        here = folder / f"zygote-{len(handed)}"
        here.mkdir(parents=True)
        pid, to_zygote, from_zygote = forkserver_client.zygote(here, os.getpid())
        inherited = InheritedProcess.take({INHERITED_ENV: f"{pid},{to_zygote},{from_zygote}"})
        assert inherited is not None, f"the forked zygote {pid} is not this process's child"
        handed.append(inherited)
        return inherited

    try:
        yield one
    finally:
        for inherited in handed:
            if inherited.poll() is None:  # not ended by its supervisor (never a group whose pid may be reused)
                inherited.end()
            for pipe in (inherited.stdin, inherited.stdout):
                with suppress(OSError):
                    pipe.close()
        if adopts:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
            for pid in _zombie_children():  # adopted while this ran (a process a killed zygote or trainer started)
                with suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)


def _zombie_children() -> list[int]:
    """This process's children that have exited and that nobody has waited for."""
    own, found = str(os.getpid()), []
    for entry in os.scandir("/proc"):
        with suppress(OSError, IndexError):
            fields = Path(entry.path, "stat").read_text().rsplit(") ", 1)[1].split()
            if entry.name.isdigit() and fields[0] == "Z" and fields[1] == own:
                found.append(int(entry.name))
    return found


NodeZygote = Callable[[], InheritedProcess | None]  # the ``node_zygote`` fixture's type
