"""Processes that keep state for a next generation: warm trainers, and trainers that stopped and hold their
stage in memory for a planned morph (:mod:`worker_agent.runtime.morph.held`)."""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import signal
from dataclasses import dataclass
from typing import Protocol

from worker_agent.agent.zygote import Adopted
from worker_agent.contract import ExitCode, TrainersDir, WarmSpool


class Process(Protocol):
    """What the supervisor uses of a trainer's process: a :class:`subprocess.Popen`, or one the zygote forked."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def kill_group(process: Process) -> None:
    """SIGKILL ``process`` and its process group, and wait for it. A trainer the zygote has not forked yet is
    killed once it says which it is (a later ``poll`` reaps it): waiting here would hold the agent's loop, and
    its heartbeats, for as long as the zygote still imports."""
    if isinstance(process, Adopted):
        process.kill_group()
        if not process.pid:
            return
    elif process.pid > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


RELEASE_SECONDS = 5.0
"""How long a trainer handed a held step may take to give up its generation and hold the step again (it polls its
abort file every 20 ms; a rendezvous or an exchange it is in is severed at once) before it is killed."""


class Ending(enum.Enum):
    """How the agent ends a trainer its controller no longer runs, this time it looks."""

    ASK = "ask"  # ask it (its abort file) to give up its generation and hold the step it was handed again
    WAIT = "wait"  # asked: it has RELEASE_SECONDS to do so
    KILL = "kill"


def ending(holds: bool, asked_at: float | None, now: float) -> Ending:
    """Pure. ``holds``: its process holds a step of the job the node goes on with, not loaded yet; ``asked_at``: when
    it was asked to give it up (None: not yet)."""
    if not holds:
        return Ending.KILL
    if asked_at is None:
        return Ending.ASK
    return Ending.WAIT if now - asked_at < RELEASE_SECONDS else Ending.KILL


@dataclass
class Finished:
    """A trainer whose generation ended and whose process now holds a step: for its generation it has exited,
    ``code`` 0 after a planned stop (it holds its stage at the stop), a failure after a generation that ended before
    it took the step it was handed (it holds that step again); the process lives on among the holders."""

    pid: int
    code: int = ExitCode.SUCCEEDED

    def poll(self) -> int:
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        return self.code


@dataclass
class Warm:
    process: Process
    spool: WarmSpool
    holds: tuple[str, int] | None = None  # (job, generation) whose stopped state this process keeps
    ran: str | None = None  # the code identity of the job it was told to build ahead: it may have run its code


class Holders:
    """The live holders of this node, by the (job, generation) whose stopped state each keeps."""

    def __init__(self) -> None:
        self._held: list[Warm] = []

    def add(self, holder: Warm) -> None:
        self._held.append(holder)

    def pids(self) -> set[int]:
        return {h.process.pid for h in self._held}

    def take(self, job_id: str) -> Warm | None:
        """A live holder of ``job_id``'s state (it leaves the holders), or None."""
        self._held = [h for h in self._held if h.process.poll() is None]
        for holder in self._held:
            if holder.holds is not None and holder.holds[0] == job_id:
                self._held.remove(holder)
                return holder
        return None

    def drop(self, keep: set[tuple[str, int]]) -> None:
        """Holders of a generation that is no longer this node's own: the next one started without them."""
        for holder in list(self._held):
            if holder.holds not in keep:
                self._held.remove(holder)
                kill_group(holder.process)
                shutil.rmtree(holder.spool.path, ignore_errors=True)


def kill_leftovers(trainers: TrainersDir) -> None:
    """Trainers a previous incarnation of this agent left behind must never join a new generation."""
    for pid_file in trainers.pid_files():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
    for spool in trainers.warm_spools():
        with contextlib.suppress(OSError, ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(spool.pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(trainers.warm_root, ignore_errors=True)
