"""Ranks of a CPU run forked from the launcher, which imports torch once for all of them.

A trainer process spends most of a cold start importing: torch, its dynamo (which torch.optim's step imports) and
the runtime take 3-6 s of CPU on a 2-core VM, paid once per rank when every rank is a new interpreter (a 2x2 layout:
four times, on the same two cores). The launcher imports them once (:func:`preload`) and forks each rank from
itself: the rank starts with them imported, sharing their pages copy-on-write.

Only for the CPU: a process that forks after CUDA is initialised cannot use CUDA in its children, so CUDA
runs keep a new interpreter per rank. The launcher forks before it starts any thread of its own (the
rendezvous store's server runs in a thread, so the ranks are told its port through a pipe), and a forked rank
never returns into the launcher's code: it ends with ``os._exit`` whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn


def preload() -> None:
    """What every rank imports before it can do anything (the bulk of its start); nothing that starts a thread."""
    import torch
    import torch._dynamo  # torch.optim's step imports it (2 s of CPU): once here, not in every rank
    import torch.distributed  # noqa: F401

    from worker_agent.runtime.model import model_api, partition  # noqa: F401
    from worker_agent.runtime.numerics import job  # noqa: F401
    from worker_agent.runtime.pipeline import engine  # noqa: F401
    from worker_agent.runtime.storage import checkpoint  # noqa: F401


class ForkedRank:
    """A rank forked from this process, with the part of :class:`subprocess.Popen` the launcher uses: ``pid``,
    ``poll``, ``wait``, ``kill`` and ``returncode`` (negative: the signal that ended it)."""

    def __init__(self, argv: Callable[[], list[str]], close: tuple[int, ...] = ()) -> None:
        """``argv()`` is the rank's trainer arguments, called in the child (it may wait for the launcher);
        ``close``: this process's file descriptors the child closes first."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            for fd in close:
                os.close(fd)
            _become_the_rank(argv)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def read_port(fd: int) -> int:
    """The rendezvous store's port, as the launcher writes it to a forked rank once the store is up."""
    said = b""
    while not said.endswith(b"\n") and (chunk := os.read(fd, 16)):
        said += chunk
    os.close(fd)
    if not said.strip().isdigit():
        raise SystemExit("spotmorph trainer: the launcher ended before it said where its rendezvous store is")
    return int(said)


def _become_the_rank(argv: Callable[[], list[str]]) -> None:
    """The child: a session of its own and the signal handlers a new interpreter has, as ``subprocess.Popen(...,
    start_new_session=True)`` would give it, then the trainer, which ends the process itself."""

    def rank() -> None:
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from worker_agent.runtime.process import trainer

        trainer.main(argv())

    end_as_an_interpreter(rank)


def end_as_an_interpreter(body: Callable[[], object]) -> NoReturn:
    """Run ``body`` in a forked child and end the process as an interpreter ends on what it raised (a number is
    the exit code, anything else is said and is 1; a traceback is printed); never returns into the parent's
    code, whatever happens."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
        else:
            code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
