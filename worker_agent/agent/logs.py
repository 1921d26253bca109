"""Shipping the trainers' logs to the controller (``ReportLogs``), so users read them without logging in here.

Each round (the agent runs one every heartbeat interval, as a task of its own: never in a heartbeat's way)
reads what this node's trainers' log files (``rank-<r>.log`` of each :class:`worker_agent.contract.GenerationDir`:
the current generation's and any earlier one's not fully sent) gained since the controller last said how
far it has them, at most :data:`MAX_CALL_BYTES` a call, shared out evenly among the files with something to
send, and moves each file on by what the controller answers. Files found when the agent starts are asked
about first (an empty chunk: the agent may have restarted); a chunk the controller did not take (a gap) is
sent again from the offset it wants. A file is done once its trainer exited and its end (``eof``) was taken.

A controller that refuses one file (its refusal names ``chunks[i]``: a job it does not know, a rank it did
not place on this node) never gets that file again and the others are sent on; one that is unreachable or
refuses the call as a whole gets the same next round. Each is logged once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import stat
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from morphing.errors import UserInputError
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.transport import CallFailed
from worker_agent.agent.wire import LogChunk
from worker_agent.contract import TrainersDir

log = logging.getLogger("spotmorph.agent")

MAX_CALL_BYTES = 256 << 10  # the most text the controller takes in one call
MAX_CALL_CHUNKS = 1024  # the most chunks it takes in one call
MAX_REFUSALS_PER_ROUND = 32  # files refused one by one within a round before the rest waits for the next
REFUSED_CHUNK = re.compile(r"chunks\[(\d+)\]")

Send = Callable[[list[LogChunk]], Awaitable[list[int]]]


class NotAFile(OSError):
    """A log path that is not a regular file (a FIFO, a device): never opened for reading."""


@dataclass
class _File:
    path: Path
    sent: int | None  # how many bytes the controller has (None: not asked yet)


def shares(wants: Sequence[int], budget: int) -> list[int]:
    """Bytes each file may send of the ``wants``: an even share of ``budget``, what small ones leave going to
    the others (so a chatty trainer never starves the rest)."""
    given = [0] * len(wants)
    order = sorted(range(len(wants)), key=wants.__getitem__)
    left = budget
    for position, i in enumerate(order):
        given[i] = min(wants[i], left // (len(order) - position))
        left -= given[i]
    return given


def _read(path: Path, offset: int, limit: int) -> tuple[int, bytes]:
    """The file's size and up to ``limit`` bytes of it from ``offset``; only a regular file is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(f"{path} is not a regular file")
        want = min(limit, info.st_size - offset)
        return info.st_size, os.pread(fd, want, offset) if want > 0 else b""
    finally:
        os.close(fd)


class LogShipper:
    """``send`` is one ReportLogs (raising :class:`CallFailed` when it gets no answer); ``running`` the trainers
    running now (a file whose trainer is not among them is sent to its end, then left alone)."""

    def __init__(
        self,
        trainers: TrainersDir,
        send: Send,
        running: Callable[[], Iterable[TrainerKey]],
        max_bytes: int = MAX_CALL_BYTES,
        max_chunks: int = MAX_CALL_CHUNKS,
    ) -> None:
        self.trainers = trainers
        self._send = send
        self._running = running
        self.max_bytes = max_bytes
        self.max_chunks = max_chunks
        self._files: dict[TrainerKey, _File] = {}
        self.finished: set[TrainerKey] = set()  # sent to its end after its trainer exited, or refused
        self._scanned = False
        self._failing = False  # a failed round was logged: the next one is only once a round worked again
        self._round = asyncio.Lock()  # one round at a time (the interval's and a flush before the VM goes)

    def pending(self) -> set[TrainerKey]:
        """The files still being sent."""
        return set(self._files)

    async def ship(self) -> int:
        """One round: how many chunks the controller took."""
        async with self._round:
            await asyncio.to_thread(self._discover)
            running = set(self._running())  # after the files were found, before they are read: see _chunks
            chunks = await asyncio.to_thread(self._chunks, running)
            return await self._deliver(chunks) if chunks else 0

    async def flush(self) -> None:
        """Rounds until one has nothing to send: before the node goes, its trainers' last lines (bound it)."""
        while await self.ship():
            pass

    def _discover(self) -> None:
        """Log files not known yet: those present at the start are asked about, later ones start at 0 (ours)."""
        for directory in self.trainers.generation_dirs():
            for rank, path in directory.log_files().items():
                key = TrainerKey(directory.job, directory.generation, rank)
                if key not in self._files and key not in self.finished:
                    self._files[key] = _File(path, 0 if self._scanned else None)
        self._scanned = True

    def _chunks(self, running: set[TrainerKey]) -> list[LogChunk]:
        """This round's chunks: questions, the ends of files whose trainers exited, and the new bytes shared out.

        ``running`` was taken after the files were found: a trainer not running then had exited (a file is
        created by its trainer's start), so everything it wrote is in its file now."""
        chunks: list[LogChunk] = []
        wanting: list[tuple[TrainerKey, _File, int, bool]] = []
        for key, file in list(self._files.items()):
            if file.sent is None:
                chunks.append(LogChunk(key, 0, b""))
                continue
            try:
                size, _ = _read(file.path, 0, 0)
            except FileNotFoundError:
                del self._files[key]  # removed (its generation's folder cleaned up): nothing to send
                continue
            except OSError as exc:
                log.warning("not sending the log of %s: %s", key, exc)
                self._finish(key)
                continue
            exited = key not in running
            if size > file.sent:
                wanting.append((key, file, size, exited))
            elif exited and size == file.sent:
                chunks.append(LogChunk(key, file.sent, b"", eof=True))  # closes a last line without a newline
            elif exited:
                self._finish(key)  # the controller has more than the file holds: nothing to add
        chunks = chunks[: self.max_chunks]
        wanting = wanting[: self.max_chunks - len(chunks)]
        given = shares([size - file.sent for _, file, size, _ in wanting if file.sent is not None], self.max_bytes)
        for (key, file, size, exited), limit in zip(wanting, given, strict=True):
            assert file.sent is not None
            if limit == 0:
                continue
            try:
                size, data = _read(file.path, file.sent, limit)
            except OSError:
                continue  # gone or changed since it was measured: the next round looks again
            if data:
                chunks.append(LogChunk(key, file.sent, data, eof=exited and file.sent + len(data) == size))
        return chunks

    async def _deliver(self, chunks: list[LogChunk]) -> int:
        for _ in range(MAX_REFUSALS_PER_ROUND):
            try:
                offsets = await self._send(chunks)
            except CallFailed as exc:
                refused = REFUSED_CHUNK.search(str(exc))
                index = int(refused.group(1)) if refused else len(chunks)
                if index >= len(chunks):
                    self._failed(str(exc))
                    return 0
                log.warning(
                    "the controller will not take the log of %s (%s); it is not sent again", chunks[index].key, exc
                )
                self._finish(chunks[index].key)
                chunks = chunks[:index] + chunks[index + 1 :]
                if not chunks:
                    return 0
                continue
            except UserInputError as exc:
                self._failed(str(exc))
                return 0
            self._took(chunks, offsets)
            return len(chunks)
        return 0

    def _took(self, chunks: list[LogChunk], offsets: list[int]) -> None:
        if self._failing:
            log.info("trainer logs reach the controller again")
            self._failing = False
        for chunk, offset in zip(chunks, offsets, strict=True):
            file = self._files.get(chunk.key)
            if file is None:
                continue
            file.sent = offset  # past a gap: back to where the controller is
            if chunk.eof and offset == chunk.offset + len(chunk.data):
                self._finish(chunk.key)

    def _failed(self, why: str) -> None:
        if not self._failing:
            log.warning("trainer logs not sent (%s); trying again every heartbeat interval", why)
            self._failing = True

    def _finish(self, key: TrainerKey) -> None:
        self._files.pop(key, None)
        self.finished.add(key)
