"""Processes of the local cluster: spawn one in a session of its own, ask whether it lives, end it, wait.

Every process the cluster starts leads a new session (``start_new_session``), so terminating it reaches
its children too, and a Ctrl-C in the terminal that ran ``spotmorph local up`` does not reach it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

LOG_TAIL = 2000  # characters of a log quoted by a timeout


class TimedOut(RuntimeError):
    """A wait ran past its deadline; the message says what it waited for (and the tail of a log)."""


def spawn(args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> int:
    """Start ``args`` in a new session with stdout and stderr appended to ``log``; returns its pid."""
    with open(log, "ab") as handle:
        environment = None if env is None else dict(env)
        process = subprocess.Popen(
            list(args), stdout=handle, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    return process.pid


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return not _is_zombie(pid)


def terminate(pid: int | None, grace: float = 15.0) -> None:
    """SIGTERM to the process group ``pid`` leads; SIGKILL to it if ``pid`` outlives ``grace`` seconds."""
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid):
            reap(pid)
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    reap(pid)


def session_members(session: int) -> list[int]:
    """Live processes whose session id is ``session`` (from /proc; none where there is no /proc)."""
    members = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                # After "pid (command) ": state, parent, process group, session, ...
                fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z" and int(fields[3]) == session:
                members.append(int(entry.name))
    return members


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child (a no-op otherwise)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    """Until the killed ``pid`` is gone: collected, when it is our child; else until it is dead or a zombie (its
    parent collects it), at most ``timeout`` seconds. A SIGKILL is delivered at once but a process takes a moment to
    die (its memory freed first); a caller that lists what is alive right after must not see it."""
    try:
        os.waitpid(pid, 0)
        return
    except ChildProcessError:
        pass
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.005)


def log_tail(log: Path | None, chars: int = LOG_TAIL) -> str:
    if log is None:
        return ""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, *, log: Path | None = None, poll: float = 0.1
) -> None:
    """Poll ``condition`` every ``poll`` seconds until it holds; :class:`TimedOut` after ``timeout`` seconds.

    The error names ``what`` it waited for and quotes the tail of ``log`` when one is given."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tail = log_tail(log)
            raise TimedOut(f"timed out after {timeout:.0f}s waiting for {what}" + (f"\n{tail}" if tail else ""))
        time.sleep(poll)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_range_base(span: int) -> int:
    """The first of ``span`` ports below the kernel's ephemeral range, for rendezvous ports chosen per generation.

    A base from ``free_port`` lies inside the ephemeral range, where every outgoing connection on this machine
    (gRPC clients, gloo's mesh) may hold one of the ``span`` ports just when a trainer wants to listen on it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = max(low - span, 10_000 + span)
    rng = random.Random()
    for _ in range(64):
        base = rng.randrange(10_000, top)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", base))
            except OSError:
                continue
        return base
    return free_port()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False
