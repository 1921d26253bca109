"""A local cluster's ``spotmorph`` daemons (its controllers, its platform) forked from the process that starts
them, not each a new interpreter, where that process may fork (:func:`spotmorph.local.vm_start.can_fork`).

A new interpreter pays its start and a controller's imports (1-1.5 s of CPU on a 2-core machine) again for every
controller; a fork pays only the imports this process has not done yet (none, for ``spotmorph local up`` forked
from the test suite's fork server, which has imported a controller's modules). The fork is what
:func:`spotmorph.local.processes.spawn` would start: a session of its own (a kill of its group reaches whatever it
starts), no stdin, its output appended to its log, the environment it is given (this one's by default), the
default signal handlers; it then runs the command as ``python -m`` does and ends as an interpreter ends. Only a
command line of this Python's ``-m spotmorph.cli`` is forked; its recorded command line stays what it was, so a
restart from a process that cannot fork (a pytest worker, with its threads) starts a new interpreter. Unlike a new
interpreter, its ``/proc/PID/cmdline`` is the starting command's (``ps`` shows ``spotmorph local up``); its pid file
names it. ``SPOTMORPH_LOCAL_FORK_VMS=0`` starts every one as a new interpreter.
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from spotmorph.local import vm_start
from spotmorph.local.processes import spawn
from worker_agent.runtime.link.spool import append_output_to

CLI = "spotmorph.cli"


def start(args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> int:
    """Start ``args`` (forked where it is this Python's ``-m spotmorph.cli``, else spawned) in a session of its
    own with its output appended to ``log``; its pid."""
    if not forkable(args):
        return spawn(args, log, env)
    environment = dict(os.environ if env is None else env)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become(list(args[3:]), log, environment)
    return pid


def forkable(args: Sequence[str]) -> bool:
    """``args`` is this Python's ``-m spotmorph.cli`` and this process may fork (``SPOTMORPH_LOCAL_FORK_VMS=0``:
    never, every process of the cluster a new interpreter)."""
    ours = list(args[:3]) == [sys.executable, "-m", CLI]
    return ours and os.environ.get(vm_start.FORK_ENV, "1") != "0" and vm_start.can_fork()


def _become(argv: list[str], log: Path, env: dict[str, str]) -> NoReturn:
    """The forked daemon: what a spawned one starts with, then the command. Never returns."""
    from worker_agent.runtime.process.forked import end_as_an_interpreter

    def command() -> None:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        append_output_to(log)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        atexit._clear()  # what this process registered is not the daemon's to run
        sys.argv = [CLI, *argv]
        sys.modules.pop(CLI, None)  # as in a new interpreter: the module runs as __main__, not imported first
        try:
            runpy.run_module(CLI, run_name="__main__", alter_sys=True)
        finally:
            atexit._run_exitfuncs()  # as an interpreter does on its way out

    end_as_an_interpreter(command)
