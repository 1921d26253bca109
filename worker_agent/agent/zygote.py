"""The agent's end of the zygote (:mod:`worker_agent.runtime.process.zygote`): warm trainers forked, not started.

The agent becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so the warm trainers the zygote
forks through a middle process are adopted by the agent: :class:`Adopted` waits for one as
:class:`subprocess.Popen` waits for a child (``pid``, ``poll``, ``wait``). A request is only a line written
to the zygote's stdin, so asking never blocks the agent's loop, even while the zygote is still importing; the
warm trainer's pid is known once the zygote answers (0 until then: nothing is signalled by pid before).

A local cluster's VM may hand its agent a zygote already forked (:class:`InheritedProcess`, named by
:data:`INHERITED_ENV`): the agent adopts it as its own, first telling it the warm trainers' environment.

Being a subreaper also makes the agent the parent of whatever a trainer's own children leave behind when the
trainer goes: :func:`reap_orphans` collects the ones nobody waits for.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import IO

from worker_agent.contract import ExitCode, WarmSpool

LOG = logging.getLogger("spotmorph.agent")
PR_SET_CHILD_SUBREAPER = 36
ZYGOTE_MODULE = "worker_agent.runtime.process.zygote"
# "PID,TO_FD,FROM_FD": a zygote this process forked before it became the agent, and the pipes to and from it
# (spotmorph.local.vm_start: a local cluster's VMs share their imports). Only the agent's own process reads it.
INHERITED_ENV = "SPOTMORPH_INHERITED_ZYGOTE"


def become_subreaper() -> bool:
    """Make this process adopt its descendants' orphans; False where the kernel cannot (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Zygote:
    """One zygote process and the warm trainers asked of it, by spool."""

    def __init__(self, process: subprocess.Popen[bytes] | InheritedProcess, spool: WarmSpool) -> None:
        self.process = process
        self.spool = spool
        self._pids: dict[str, int] = {}
        self._failed: dict[str, str] = {}
        self._said = b""

    @classmethod
    def start(cls, python: str, spool: WarmSpool, env: dict[str, str] | None) -> Zygote | None:
        """Start a zygote with its files in ``spool``; None where it cannot be (no subreaper, no Python)."""
        if not become_subreaper():
            return None
        spool.path.mkdir(parents=True, exist_ok=True)
        command = [python, "-m", ZYGOTE_MODULE, f"--spool={spool.path}", f"--parent={os.getpid()}"]
        try:
            with open(spool.log_file, "ab") as log:
                process = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, process_group=0, env=env
                )
        except OSError as exc:
            LOG.warning("cannot start the warm trainers' zygote: %s", exc.strerror or exc)
            return None
        spool.pid_file.write_text(str(process.pid))
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        return cls(process, spool)

    @classmethod
    def adopt(cls, inherited: InheritedProcess, spool: WarmSpool, env: dict[str, str] | None) -> Zygote | None:
        """Take over a zygote this process started before it was the agent: tell it the warm trainers'
        environment and its log; None (and it is ended) where this process cannot adopt orphans."""
        if not become_subreaper():
            inherited.end()
            return None
        spool.path.mkdir(parents=True, exist_ok=True)
        spool.pid_file.write_text(str(inherited.pid))
        settle = {"env": dict(os.environ) if env is None else env, "log": str(spool.log_file)}
        try:
            inherited.stdin.write((json.dumps(settle) + "\n").encode())
            inherited.stdin.flush()
        except OSError as exc:
            LOG.warning("the inherited zygote is gone (%s); warm trainers start as new interpreters", exc)
            inherited.end()
            return None
        os.set_blocking(inherited.stdout.fileno(), False)
        return cls(inherited, spool)

    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, spool: WarmSpool) -> Adopted:
        """Ask for a warm trainer in ``spool`` (answered when the zygote gets to it)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps({"spool": str(spool.path)}) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self._failed[str(spool.path)] = f"the zygote is gone: {exc}"
        return Adopted(self, str(spool.path))

    def answer(self, spool: str) -> tuple[int, str]:
        """(pid, "") once the zygote forked ``spool``'s warm trainer; (0, why) if it will not; (0, "") not yet."""
        self._read()
        if spool in self._pids:
            return self._pids[spool], ""
        if spool in self._failed:
            return 0, self._failed[spool]
        if not self.alive():
            return 0, f"the zygote exited with code {self.process.returncode}"
        return 0, ""

    def _read(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(BlockingIOError, OSError):
            while select.select([self.process.stdout], [], [], 0)[0]:
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    break
                self._said += chunk
        *lines, self._said = self._said.split(b"\n")
        for line in lines:
            try:
                reply = json.loads(line)
                spool = str(reply["spool"])
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(reply.get("pid"), int) and reply["pid"] > 0:
                self._pids[spool] = int(reply["pid"])
            else:
                self._failed[spool] = str(reply.get("error", "no pid"))

    def stop(self) -> None:
        """Close its stdin (it exits) and kill it."""
        _end(self.process)


def _end(process: subprocess.Popen[bytes] | InheritedProcess) -> None:
    """Close a zygote's stdin (it exits on that), kill its process group and wait for it."""
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _stat_fields(path: Path) -> list[str]:
    """The fields of a ``/proc/PID/stat`` after the command's name: state, parent, process group, session, ..."""
    return path.read_text().rsplit(") ", 1)[1].split()


class InheritedProcess:
    """A zygote this process forked before it became the agent (exec): its pid and the pipes to and from it,
    with the part of :class:`subprocess.Popen` :class:`Zygote` uses."""

    def __init__(self, pid: int, to_fd: int, from_fd: int) -> None:
        self.pid = pid
        self.stdin: IO[bytes] = os.fdopen(to_fd, "wb")
        self.stdout: IO[bytes] = os.fdopen(from_fd, "rb", buffering=0)
        self.returncode: int | None = None

    @classmethod
    def take(cls, environ: dict[str, str] | os._Environ[str]) -> InheritedProcess | None:
        """The zygote :data:`INHERITED_ENV` names (removed from ``environ``: nothing this starts inherits it);
        None where there is none, or what it names is not a child of this process with pipes to it."""
        value = environ.pop(INHERITED_ENV, None)
        if value is None:
            return None
        try:
            pid, to_fd, from_fd = (int(part) for part in value.split(","))
            fifos = all(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (to_fd, from_fd))
            ours = _stat_fields(Path(f"/proc/{pid}/stat"))[1] == str(os.getpid())
        except (ValueError, OSError, IndexError):
            fifos = ours = False
        if not (fifos and ours):
            LOG.warning("%s=%.40r names no zygote of this process; one of its own comes instead", INHERITED_ENV, value)
            return None
        for fd in (to_fd, from_fd):
            os.set_inheritable(fd, False)
        return cls(pid, to_fd, from_fd)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # collected already (it is gone)
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.01)
        return code

    def end(self) -> None:
        """End it as :meth:`Zygote.stop` does, and close the pipe from it: a zygote this agent has no use for."""
        _end(self)
        with contextlib.suppress(OSError):
            self.stdout.close()


class Adopted:
    """A warm trainer the zygote forked and this process adopted, waited for as a child: ``pid`` (0 until the
    zygote answers), ``poll``, ``wait``, ``returncode``."""

    def __init__(self, zygote: Zygote, spool: str) -> None:
        self._zygote = zygote
        self._spool = spool
        self._pid = 0
        self._killed = False
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        if not self._pid and self.returncode is None:
            self._pid, why = self._zygote.answer(self._spool)
            if why:
                LOG.warning("no warm trainer in %s: %s", Path(self._spool).name, why)
                self.returncode = ExitCode.NOT_STARTED
            elif self._pid and self._killed:
                self._kill()
        return self._pid

    def kill_group(self) -> None:
        """SIGKILL its process group: now, or as soon as the zygote says which it is."""
        self._killed = True
        if self.poll() is None and self._pid:  # never a pid already waited for: it may be another's by now
            self._kill()

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._pid, signal.SIGKILL)

    def poll(self) -> int | None:
        if self.returncode is not None or not self.pid:
            return self.returncode
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # not ours after all (never adopted): it is no warm trainer of this agent
            self.returncode = ExitCode.NOT_STARTED
            return self.returncode
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"warm trainer in {self._spool}", timeout or 0.0)
            time.sleep(0.01)
        return code


def reap_orphans(waited: set[int]) -> None:
    """Collect this process's exited children that nobody waits for (orphans it adopted as a subreaper).

    Called every beat: with no exited child at all (nearly always) it is one ``waitid`` that reaps nothing;
    only an exited child that is waited for elsewhere (its handle has not polled it yet) hides others behind
    it, and then ``/proc`` is read for the rest."""
    while True:
        try:
            exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return  # no children at all
        if exited is None:
            return
        if exited.si_pid in waited:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(exited.si_pid, os.WNOHANG)
    own = str(os.getpid())
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in waited:
                continue
            with contextlib.suppress(OSError, IndexError):
                fields = _stat_fields(Path(entry.path, "stat"))
                if fields[0] == "Z" and fields[1] == own:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(int(entry.name), os.WNOHANG)
