"""The agent's side of an eviction notice: watch Scheduled Events, push a notice at once, start the timer after
which the trainers stop on their own should no controller hear of it, and tell the platform it may evict.

The loop (:mod:`~worker_agent.agent.daemon`) keeps the notice in :class:`~worker_agent.agent.config.AgentState`
(every heartbeat carries it) and decides the stop alone (:func:`~worker_agent.agent.decisions.stop_alone`); this
side only calls it back (:class:`NoticeHooks`), so neither waits on the other: the metadata service may be slow
and a controller may not answer at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from worker_agent.agent import decisions
from worker_agent.agent.config import AgentConfig, AgentState
from worker_agent.agent.decisions import EvictionNotice
from worker_agent.agent.progress import TrainerReport
from worker_agent.scheduled_events import (
    EvictionNoticed,
    EvictionPoller,
    EvictionWatcher,
    EvictionWithdrawn,
    ScheduledEventsClient,
    ScheduledEventsError,
)

log = logging.getLogger("spotmorph.agent")


@dataclass(frozen=True)
class NoticeHooks:
    """What this side asks of the loop."""

    push: Callable[[EvictionNotice], Awaitable[None]]  # ReportEvent (a failure is the next heartbeat's)
    wake: Callable[[], None]  # look now: the next beat carries the notice
    stop_alone: Callable[[], None]  # the notice has waited: stop alone unless a controller heard of it
    last_logs: Callable[[], Awaitable[None]]  # the trainers' last lines, before the platform takes the VM


class Evictions:
    def __init__(self, config: AgentConfig, state: AgentState, hooks: NoticeHooks) -> None:
        self.config = config
        self.state = state
        self.hooks = hooks
        self.acknowledging: asyncio.Task[None] | None = None  # the eviction acknowledgement in flight
        self.timer: asyncio.Task[None] | None = None  # until the stop alone is due

    def close(self) -> None:
        for task in (self.acknowledging, self.timer):
            if task is not None:
                task.cancel()

    async def watch(self) -> None:
        """Poll Scheduled Events every ``poll_seconds``: a notice is pushed at once, a withdrawn one cleared."""
        assert self.config.imds_url is not None
        watcher = EvictionWatcher(self.config.vm_name or self.state.node.node_name or self.config.name)
        poller = EvictionPoller(ScheduledEventsClient(self.config.imds_url), watcher)
        while True:
            if not watcher.vm_name:
                watcher.vm_name = self.state.node.node_name
            for fact in await asyncio.to_thread(poller.poll):
                pending = self.state.notice
                if isinstance(fact, EvictionWithdrawn) and pending is not None and pending.event_id == fact.event_id:
                    log.warning("eviction %s withdrawn (%s): this node stays", fact.event_id, fact.reason)
                    self.state.notice = None  # heartbeats stop carrying it
                    self.hooks.wake()
                if isinstance(fact, EvictionNoticed) and self.state.notice is None:
                    await self._noticed(fact)
            await asyncio.sleep(self.config.poll_seconds)

    async def _noticed(self, fact: EvictionNoticed) -> None:
        not_before = fact.not_before.timestamp() if fact.not_before else None
        deadline = decisions.notice_deadline(not_before, time.time())
        self.state.notice = EvictionNotice(fact.event_id, deadline)
        self.state.noticed_at = time.monotonic()
        log.warning("eviction notice %s: gone at %s", fact.event_id, fact.not_before)
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.create_task(self._alone_after(self.config.alone_after_seconds))  # before the push,
        await self.hooks.push(self.state.notice)  # which may take a call's whole timeout to fail
        self.hooks.wake()

    async def _alone_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.hooks.stop_alone()

    def acknowledge_if_done(self, reports: list[TrainerReport]) -> None:
        """Tell the platform it may evict now (:func:`~worker_agent.agent.decisions.may_acknowledge`), in the
        background: the loop never waits on the metadata service."""
        notice = self.state.notice
        if self.config.imds_url is None or notice is None:
            return
        untold = self.state.stopped_alone is not None
        if not decisions.may_acknowledge(notice, reports, self.state.desired, untold):
            return
        if self.acknowledging is not None and not self.acknowledging.done():
            return  # one acknowledgement in flight at a time
        self.acknowledging = asyncio.create_task(self._acknowledge(self.config.imds_url, notice))

    async def _acknowledge(self, imds_url: str, notice: EvictionNotice) -> None:
        await self.hooks.last_logs()  # the platform may take the VM as soon as it is acknowledged
        try:
            await asyncio.to_thread(ScheduledEventsClient(imds_url).acknowledge, notice.event_id)
        except ScheduledEventsError as exc:
            log.warning("could not acknowledge eviction: %s", exc)
            return
        if self.state.notice is not None and self.state.notice.event_id == notice.event_id:
            self.state.notice = replace(self.state.notice, acknowledged=True)
        log.info("acknowledged eviction %s: this node's trainers are stopped", notice.event_id)
