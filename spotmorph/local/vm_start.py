"""A local cluster's VMs forked from one process that imported what a trainer imports, not each from scratch.

A VM's agent forks its warm trainers from a zygote (:mod:`worker_agent.runtime.process.zygote`) whose imports (torch,
its compiler front end, the runtime) cost 6-8 s of CPU: on a VM, once per VM. A local cluster's VMs share one
machine, so a six-VM cluster spent 40 s of CPU importing the same modules six times before its first step.
Here the process that starts the VMs imports once, then forks each VM: the fork leads a session of its own,
enters the VM's network namespace, forks the VM's zygote (its imports done), and execs the agent, a new
interpreter as on a VM, which adopts the zygote as its child (:data:`worker_agent.agent.zygote.INHERITED_ENV`).
Where forking is not safe (this process runs threads) the VM starts as a new process, its zygote its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from worker_agent.agent.zygote import INHERITED_ENV
from worker_agent.runtime.link.spool import append_output_to

FORK_ENV = "SPOTMORPH_LOCAL_FORK_VMS"  # "0": every VM a new process with a zygote of its own, as before
CLONE_NEWNET = 0x40000000  # linux/sched.h
NETNS_DIR = Path("/run/netns")  # where `ip netns add` keeps a namespace's handle


def can_fork() -> bool:
    """This process may fork a VM: Linux, and one thread (a fork copies only the calling thread, so a lock
    another holds stays held in the child; the clients that run gRPC or the controller never fork here)."""
    try:
        return sys.platform == "linux" and len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def start(args: Sequence[str], log: Path, namespace: str | None) -> int | None:
    """Fork a VM running ``args`` (the agent's command line) in ``namespace`` (None: this one), its output
    appended to ``log``; returns the agent's pid (the fork's: it execs the agent), or None where the imports
    fail here (the VM is then better started as a new process, whose agent says what fails)."""
    try:
        from worker_agent.runtime.process import warm

        warm._preload()  # once per process that starts VMs (a no-op where done): every VM's zygote shares it
    except Exception as exc:
        print(
            f"spotmorph local: cannot import what a trainer imports ({exc!r}); VMs start as new processes",
            file=sys.stderr,
        )
        return None
    zygote_in, to_zygote = os.pipe()  # the agent's requests
    from_zygote, zygote_out = os.pipe()  # the zygote's answers
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_vm(list(args), log, namespace, (zygote_in, to_zygote, zygote_out, from_zygote))
    for fd in (zygote_in, to_zygote, zygote_out, from_zygote):
        os.close(fd)
    return pid


def _become_vm(args: list[str], log: Path, namespace: str | None, pipes: tuple[int, int, int, int]) -> NoReturn:
    """The forked VM: its session, its output, its namespace, its zygote; then the agent. Never returns."""
    zygote_in, to_zygote, zygote_out, from_zygote = pipes
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        append_output_to(log)
        if namespace is not None:
            enter_network_namespace(namespace)
        zygote = os.fork()
        if zygote == 0:
            _become_zygote(zygote_in, zygote_out, (to_zygote, from_zygote))
        os.close(zygote_in)
        os.close(zygote_out)
        for fd in (to_zygote, from_zygote):
            os.set_inheritable(fd, True)
        env = {**os.environ, INHERITED_ENV: f"{zygote},{to_zygote},{from_zygote}"}
        os.execve(args[0], args, env)
    except BaseException as exc:  # a forked child never returns into its parent's code
        os.write(2, f"spotmorph local: cannot start the VM's agent {args[:1]}: {exc!r}\n".encode())
    os._exit(127)


def _become_zygote(requests: int, answers: int, close: tuple[int, ...]) -> NoReturn:
    """The VM's zygote: its own process group, requests on stdin, answers on stdout; serves until the agent
    (its parent once it execs) closes the pipe."""
    from worker_agent.runtime.process import warm, zygote
    from worker_agent.runtime.process.forked import end_as_an_interpreter

    def serve() -> int:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter's, whatever the command set
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        os.dup2(requests, 0)
        os.dup2(answers, 1)
        os.close(requests)
        os.close(answers)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (fd 0 is the pipe now; the interpreter's object read the old one)
        warm._tune_allocator()
        return zygote.serve(os.getppid())

    end_as_an_interpreter(lambda: sys.exit(serve()))


def enter_network_namespace(name: str) -> None:
    """Move this (single-threaded) process into the network namespace ``ip netns add NAME`` made."""
    handle = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(handle, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into {name}: {os.strerror(error)}")
    finally:
        os.close(handle)
