"""After a failed collective: hold the last completed step, and write it when the controller says so.

A rank whose collective fails or times out (a peer is gone: its connections were reset, or it stayed
silent for ``peer_timeout_seconds``) abandons the step in flight. Every collective of a step comes
before its optimizer update (:meth:`worker_agent.runtime.pipeline.engine.StageRunner.run_step`), so the
parameters and optimizer state in memory are those of the last completed step. The rank then

1. severs its connections (shuts down every connected TCP socket: gloo's pairs and the store's
   client; aborts NCCL communicators), so peers blocked on it fail at once instead of waiting out
   their timeout, and the failure spreads through the generation in milliseconds;
2. reports :class:`~worker_agent.contract.CollectiveFailed` (its stage, replica and held step), which
   its agent pushes to the controller at once;
3. waits for the controller's :class:`~worker_agent.contract.SalvageOrder`: a rank it names writes
   every layer of its stage from memory into ``step-NNNNNNNN-gG/`` (G: its generation) with a part file
   of its own, and the first writer commits the manifest once every writer's part is there, before the order's deadline.
   A rank it does not name exits; so does one that waits longer than the hold limit or is asked to stop
   meanwhile (``spotmorph train``, which has no controller, asks that of every survivor). A rank that also
   keeps the step in memory (its agent gave it a hold spool, the job's ``morph_through_memory``) and is
   asked to stop ends its generation with success and holds the step for the next one, as after a planned
   stop (:mod:`worker_agent.runtime.morph.held`): that is how the controller keeps the step in memory.

A half-written just-in-time checkpoint has no manifest, so it is no checkpoint; and only the step the
controller records as committed is named in the next generation's assignment.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from worker_agent.contract import (
    CollectiveFailed,
    ControlDir,
    ExitCode,
    SalvageOrder,
    SalvageWritten,
    TrainerFailed,
)
from worker_agent.contract.wake import poke
from worker_agent.runtime.errors import FenceError, GenerationFenced
from worker_agent.runtime.link.control import ProgressLog
from worker_agent.runtime.pipeline.comm import Communicators
from worker_agent.runtime.storage.checkpoint import FORMAT, MANIFEST, LayerPayload, atomic_write, step_dir
from worker_agent.runtime.storage.fence import Fence, check_fence
from worker_agent.runtime.storage.writer import load_part, part_files, write_layer_files

POLL_SECONDS = 0.02
FENCE_POLL_SECONDS = 0.5  # a holding rank re-reads the fence file this often
# Only for tests: the writers pause this long after their layer files, before their part file (a kill
# can then land inside the write).
PAUSE_ENV = "SPOTMORPH_TEST_SALVAGE_PAUSE_SECONDS"
_MARKERS = ("gloo", "nccl", "connection closed", "connection reset", "timed out", "broken pipe")


def is_collective_failure(exc: BaseException) -> bool:
    """A failure of communication with a peer (not a bug in the model or bad input)."""
    if isinstance(exc, dist.DistError | TimeoutError | ConnectionError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _MARKERS)


def sever(communicators: Communicators) -> int:
    """Abort ``communicators`` and shut down every connected TCP socket of this process (listening ones stay);
    returns how many sockets.

    Peers blocked on this rank in gloo then see the connection close at once. Closing is left to the
    owners of the descriptors (shutdown only ends the connection), so nothing is freed twice.
    """
    communicators.abort()
    count = 0
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        with contextlib.suppress(OSError, ValueError):
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
            try:
                inet = sock.family in (socket.AF_INET, socket.AF_INET6)
                if inet and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
                    count += 1
            finally:
                sock.detach()
    return count


class AbortWatch:
    """Severs this rank's connections when its agent asks (``ControlDir.request_abort``: the controller holds
    the generation because a rank is lost), so a collective blocked on the lost peer fails now instead of
    after ``peer_timeout_seconds``; the rank then holds its step like any rank whose collective failed.

    A thread polls the control file: the main thread may be blocked inside a collective (in C++, where no
    Python signal handler runs), and aborting NCCL communicators from another thread is what unblocks it.
    """

    def __init__(self, control: ControlDir | None, communicators: Communicators) -> None:
        self.control = control
        self.communicators = communicators
        self.fired = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="spotmorph-abort-watch", daemon=True)

    def start(self) -> None:
        if self.control is not None:
            self._thread.start()

    def stop(self, wait: bool = False) -> None:
        """Stop watching (``wait``: until the watcher has returned, so no cut it began lands later)."""
        self._stopped.set()
        if wait and self._thread.is_alive():
            self._thread.join()

    def _watch(self) -> None:
        assert self.control is not None
        while not self._stopped.wait(POLL_SECONDS):
            if self.control.abort_requested():
                self.fired.set()
                sever(self.communicators)
                return

    def explain(self, exc: BaseException) -> str:
        """The error a held rank reports: its agent's order when that is what failed the collective."""
        return f"aborted on its agent's order (generation held): {exc!r}" if self.fired.is_set() else repr(exc)


class Timeouts:
    """The world group's timeout: ``long`` in the phases that wait on slow local work (start-up, checkpoint
    writes, evaluation), ``peer`` during steps. The groups that move model tensors are created with
    ``peer`` (a point-to-point receive keeps the timeout of its group's creation)."""

    def __init__(self, long: float, peer: float) -> None:
        self.long = timedelta(seconds=max(long, peer))
        self.peer = timedelta(seconds=peer)

    def settle(self) -> None:
        """Wait (up to ``long``) until every rank is here, then bound the next collectives by ``peer``."""
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(self.long)
        dist.barrier()
        _set_pg_timeout(self.peer)


def part_name(generation: int, rank: int) -> str:
    return f"salvage-g{generation}-rank-{rank}.json"


def write_part(
    root: Path, step: int, generation: int, rank: int, payloads: dict[str, LayerPayload], fence: Fence | None = None
) -> None:
    """This writer's layer files, then its part file (the list of them, with sizes and checksums)."""
    if fence is not None:
        check_fence(root, fence)  # a newer generation has started: the controller fell back, write nothing
    directory = step_dir(root, step, generation)
    parts = directory / ".parts"
    parts.mkdir(parents=True, exist_ok=True)
    entries = write_layer_files(directory, payloads, rank)
    pause = float(os.environ.get(PAUSE_ENV) or 0)
    if pause > 0:
        time.sleep(pause)
    atomic_write(parts / part_name(generation, rank), json.dumps(entries).encode())


def commit(
    root: Path, step: int, order: SalvageOrder, generation: int, manifest: dict[str, Any], fence: Fence | None = None
) -> bool:
    """The manifest, once every writer's part is there; False when the deadline came first.

    The fence is checked right before the manifest's rename (:class:`GenerationFenced` when a newer generation
    started meanwhile), as for every other checkpoint."""
    directory = step_dir(root, step, generation)
    names = [directory / ".parts" / part_name(generation, r) for r in order.writers]
    while not all(p.exists() for p in names):
        if time.time() >= order.deadline:
            return False
        time.sleep(POLL_SECONDS)
    files = sorted((e for p in names for e in part_files(load_part(p), p)), key=lambda e: e["path"])
    if time.time() >= order.deadline:
        return False
    body = {"format": FORMAT, **manifest, "step": step, "files": files, "committed_at": time.time()}
    before_rename = None if fence is None else (lambda: check_fence(root, fence))
    atomic_write(directory / MANIFEST, json.dumps(body, indent=1, sort_keys=True).encode(), before_rename)
    return True


def wait_for_order(
    control: ControlDir | None, limit: float, fenced: Callable[[], str | None] = lambda: None
) -> SalvageOrder | str | None:
    """The controller's order once the agent publishes it; None after ``limit`` seconds, on a bad file, or
    when a stop is requested meanwhile (``spotmorph train`` asks that of the survivors: no one salvages);
    the fence's message when a newer generation raised it meanwhile (no salvage of this one can commit)."""
    deadline = time.monotonic() + limit
    next_fence_check = 0.0
    while time.monotonic() < deadline:
        if control is None or control.stop_requested():
            return None
        text = control.salvage_request()
        if text:
            try:
                return SalvageOrder.from_json(text)
            except ValueError:
                return None
        if time.monotonic() >= next_fence_check:
            if why := fenced():
                return why
            next_fence_check = time.monotonic() + FENCE_POLL_SECONDS
        time.sleep(POLL_SECONDS)
    return None


def _fenced_off(root: Path, fence: Fence | None) -> str | None:
    """Why this generation is fenced off (a newer one raised the fence), or None while it may still commit."""
    if fence is None:
        return None
    try:
        check_fence(root, fence)
    except FenceError as exc:  # raised past it, or damaged (which refuses every writer)
        return str(exc)
    return None


def hold(
    *,
    rank: int,
    generation: int,
    stage: int,
    replica: int,
    step: int,
    error: str,  # what failed the collective (AbortWatch.explain)
    progress: ProgressLog,
    control: ControlDir | None,
    root: Path,
    hold_seconds: float,
    payloads: Callable[[], dict[str, LayerPayload]],
    manifest: Callable[[], dict[str, Any]],
    communicators: Communicators,
    fence: Fence | None = None,
    kept: bool = False,
    snapshots: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
) -> ExitCode:
    """Steps 1-3 of the module docstring; the exit code of the trainer. ``kept``: this rank also keeps the step
    in memory (the caller's), so a stop asked meanwhile ends its generation with success: the controller keeps
    the step in memory for the next generation instead of having it written."""
    sever(communicators)
    own, received = snapshots  # the peer snapshots it keeps (its own stage's copies, and those it received whole)
    progress.emit(CollectiveFailed(generation, stage, replica, step, error[:500], list(own), list(received)))
    poke()  # the agent pushes it to the controller at once, which acts on the first such report
    order = wait_for_order(control, hold_seconds, lambda: _fenced_off(root, fence))
    if isinstance(order, str):
        progress.emit(TrainerFailed(kind="fenced", message=order))
        return ExitCode.FENCED
    if order is None and kept and control is not None and control.stop_requested():
        return ExitCode.SUCCEEDED
    if order is None:
        progress.emit(TrainerFailed(kind="abort", message=f"collective failed ({error}); no salvage order came"))
        return ExitCode.ABORTED
    if rank not in order.writers:
        return ExitCode.SUCCEEDED
    if order.step != step or time.time() >= order.deadline:
        why = f"salvage order for step {order.step} (this rank holds {step}) or past its deadline"
        progress.emit(TrainerFailed(kind="abort", message=why))
        return ExitCode.ABORTED
    started = time.perf_counter()
    try:
        write_part(root, step, generation, rank, payloads(), fence)
        committed = rank == order.committer and commit(root, step, order, generation, manifest(), fence)
    except GenerationFenced as exc:
        progress.emit(TrainerFailed(kind="fenced", message=str(exc)))
        return ExitCode.FENCED
    seconds = time.perf_counter() - started
    progress.emit(SalvageWritten(step, committed, seconds, step if committed else None))
    if rank == order.committer and not committed:
        return ExitCode.CHECKPOINT_NOT_WRITTEN
    return ExitCode.SUCCEEDED
