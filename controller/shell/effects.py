"""The runner's side effects under way, as tasks of one :class:`asyncio.TaskGroup` that lives until close.

A side effect (a provider call) reports its expected failures itself, as events for the next decision.
Anything else it raises is a bug: it ends the group, is logged at once, and is raised again from
:meth:`Effects.settle` and :meth:`Effects.close` instead of vanishing with a task nobody awaits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from controller.eventlog import provider_facts
from controller.eventlog.fact import Fact
from controller.providers.base import Provider, ProviderInbox
from scheduler.pools import PoolKind

log = logging.getLogger("spotmorph.controller")

Effect = Coroutine[Any, Any, None]


class Effects:
    """Started on the first :meth:`spawn` (the runner is built outside the event loop in tests)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Effect | None] = asyncio.Queue()
        self._group: asyncio.Task[None] | None = None
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def spawn(self, effect: Effect) -> None:
        if self._group is None:
            self._group = asyncio.ensure_future(self._hold())
            self._group.add_done_callback(self._ended)
        if self._group.done():  # the group ended (a bug, logged): nothing runs any more, nothing is left pending
            effect.close()
            log.error("side effect %r not run: the side effects' task group has ended", effect)
            return
        self._running += 1
        self._idle.clear()
        self._queue.put_nowait(effect)

    async def _hold(self) -> None:
        async with asyncio.TaskGroup() as group:
            while (effect := await self._queue.get()) is not None:
                group.create_task(effect).add_done_callback(self._finished)

    def _finished(self, _: asyncio.Task[None]) -> None:
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    def _ended(self, group: asyncio.Task[None]) -> None:
        """Log a failure; close what the group never took (the loop may end before it ran: no coroutine is
        left never awaited)."""
        if not group.cancelled() and (failure := group.exception()) is not None:
            log.error("a side effect failed unexpectedly; no further side effects run", exc_info=failure)
        while not self._queue.empty():
            if (effect := self._queue.get_nowait()) is not None:
                effect.close()

    async def settle(self) -> None:
        """Wait for the side effects under way (and for any they lead to); raise the group's failure, if any."""
        while self._group is not None and not self._group.done() and not self._idle.is_set():
            idle = asyncio.ensure_future(self._idle.wait())
            await asyncio.wait([idle, self._group], return_when=asyncio.FIRST_COMPLETED)
            idle.cancel()
        if self._group is not None and self._group.done():
            self._group.result()

    async def close(self) -> None:
        """Let the side effects under way finish, then end the group."""
        if self._group is None:
            return
        if not self._group.done():
            self._queue.put_nowait(None)
        await self._group
        self._group = None


async def release(provider: Provider, inbox: ProviderInbox, node: str) -> None:
    """Release a VM; a failure is an event (counted in spotmorph_provider_errors_total), never lost in a task."""
    try:
        await provider.release(node)
    except Exception as exc:
        log.warning("releasing %s failed: %s", node, exc)
        inbox.report(provider_facts.ProviderReleaseFailed(node, str(exc)))


async def request_capacity(provider: Provider, slots: int, pool: PoolKind = PoolKind.SPOT) -> Fact:
    """Ask the provider for ``slots`` of ``pool``; what came of it, as the event the log keeps (failures logged too:
    on-demand from a provider without an on-demand pool is one, naming the setting that adds it)."""
    try:
        await provider.request_capacity(slots, pool)
    except Exception as exc:
        log.warning("capacity request for %d %s slots failed: %s", slots, pool, exc)
        return provider_facts.ProviderCapacityRequestFailed(slots, str(exc))
    return provider_facts.CapacityRequested(slots)
