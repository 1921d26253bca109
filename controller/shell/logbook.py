"""Trainer logs for the API: appended on one writer thread, read on reader threads, never on the event loop.

Log lines are not decisions: they take neither the runner's lock nor a reconcile, and a node's logs never
wait for (or hold up) a heartbeat. One writer thread makes the appends one at a time (each stream's
offset is read and moved in order); followers wait on :meth:`LogBook.next_change`, set after every append.
A database that cannot be written now is UNAVAILABLE to the caller (the agent sends again later).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from controller.core.logs import LogChunk, LogLine
from controller.persistence.store import Store, unavailable
from controller.shell.failures import DecisionsFailed, describe

WRITER_THREAD = "spotmorph-log-writer"
READER_THREAD_PREFIX = "spotmorph-log-reader"
T = TypeVar("T")


class LogBook:
    """The store's log tables, from the event loop; ``close()`` after the last call."""

    def __init__(self, store: Store, readers: int = 2) -> None:
        self._store = store
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WRITER_THREAD)
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix=READER_THREAD_PREFIX)
        self._changed = asyncio.Event()
        self._changed_jobs: dict[str, asyncio.Event] = {}  # only for jobs someone waits on

    def close(self) -> None:
        """Wait for the appends and reads in flight, then stop the threads."""
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)

    def next_change(self, job: str | None = None) -> asyncio.Event:
        """An event set by the next append (of ``job``'s lines, when named): take it before reading, so no
        append goes unnoticed; a follower of one job is not woken by another's lines."""
        if job is None:
            return self._changed
        return self._changed_jobs.setdefault(job, asyncio.Event())

    async def append(self, node: str, chunks: Sequence[LogChunk], at: float) -> list[int]:
        """Take one ReportLogs from ``node``; the offset each chunk's stream is at after it."""
        try:
            offsets = await self._run(self._writer, self._store.append_logs, node, chunks, at)
        except Exception as exc:
            if unavailable(exc):
                raise DecisionsFailed(
                    f"the state database cannot be written ({describe(exc)}); send again later"
                ) from exc
            raise
        self._changed.set()
        self._changed = asyncio.Event()
        for job in {chunk.job for chunk in chunks}:
            waiting = self._changed_jobs.pop(job, None)
            if waiting is not None:
                waiting.set()
        return offsets

    async def lines(
        self, job: str, after: int, rank: int | None, generation: int | None, limit: int
    ) -> tuple[LogLine, ...]:
        """Up to ``limit`` of the job's lines after the cursor ``after`` (of that rank and generation, if given)."""
        return tuple(await self._run(self._readers, self._store.log_lines, job, after, rank, generation, limit))

    async def _run(self, pool: ThreadPoolExecutor, call: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(call, *args))
