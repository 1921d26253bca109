"""The agent's side of an eviction notice: watch the cloud's notices (:mod:`worker_agent.notices`), push a notice
at once, start the timer after which the trainers stop on their own should no controller hear of it, and tell the
platform it may evict (Azure); keep the cloud's early warning of an eviction for the heartbeats.

The loop (:mod:`~worker_agent.agent.daemon`) keeps the notice in :class:`~worker_agent.agent.config.AgentState`
(every heartbeat carries it) and decides the stop alone (:func:`~worker_agent.agent.decisions.stop_alone`); this
side only calls it back (:class:`NoticeHooks`), so neither waits on the other: the metadata service may be slow
and a controller may not answer at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from worker_agent.agent import decisions
from worker_agent.agent.config import AgentConfig, AgentState
from worker_agent.agent.decisions import EvictionNotice, EvictionRisk
from worker_agent.agent.progress import TrainerReport
from worker_agent.notices import gcp
from worker_agent.notices.facts import (
    AnyFact,
    EvictionNoticed,
    EvictionRiskNoticed,
    EvictionRiskWithdrawn,
    EvictionWithdrawn,
    NoticeSource,
)
from worker_agent.notices.sources import notice_source
from worker_agent.scheduled_events import ScheduledEventsClient, ScheduledEventsError

log = logging.getLogger("spotmorph.agent")
T = TypeVar("T")


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
        self.source: NoticeSource | None = None  # the cloud's metadata service (--cloud, --imds-url)
        if config.imds_url is not None:
            self.source = notice_source(config.cloud, config.imds_url, self._vm_name, config.poll_seconds)

    def _vm_name(self) -> str:
        return self.config.vm_name or self.state.node.node_name or self.config.name

    def close(self) -> None:
        for task in (self.acknowledging, self.timer):
            if task is not None:
                task.cancel()

    async def watch(self) -> None:
        """Poll the cloud's notices: a notice is pushed at once, a withdrawn one cleared, and an early warning is
        carried by every heartbeat while it stands."""
        assert self.source is not None
        while True:
            polled = await in_daemon_thread(self.source.poll)
            for fact in polled.facts:
                await self._take(fact)
            await asyncio.sleep(polled.wait)

    async def _take(self, fact: AnyFact) -> None:
        pending, risk = self.state.notice, self.state.risk
        if isinstance(fact, EvictionWithdrawn) and pending is not None and pending.event_id == fact.event_id:
            log.warning("eviction %s withdrawn (%s): this node stays", fact.event_id, fact.reason)
            self.state.notice = None  # heartbeats stop carrying it
            self.hooks.wake()
        elif isinstance(fact, EvictionNoticed) and pending is None:
            await self._noticed(fact)
        elif isinstance(fact, EvictionRiskNoticed) and risk is None:
            log.warning(
                "eviction risk (%s, %s): the controller grows nothing onto this node and moves its job off when it can",
                fact.source,
                fact.detail or "no detail",
            )
            self.state.risk = EvictionRisk(fact.source, fact.noticed_at)
            self.hooks.wake()
        elif isinstance(fact, EvictionRiskWithdrawn) and risk is not None and risk.source == fact.source:
            log.warning("eviction risk (%s) withdrawn: %s", fact.source, fact.reason)
            self.state.risk = None
            self.hooks.wake()

    async def shutdown_notice(self) -> None:
        """The guest is being shut down (``--cloud gcp``: the SIGTERM of a preemption): a notice like any other, so
        the trainers hand off or write their step, unless one is pending already."""
        if self.state.notice is None:
            await self._noticed(gcp.shutdown_notice(time.time()))

    async def _noticed(self, fact: EvictionNoticed) -> None:
        not_before = fact.not_before.timestamp() if fact.not_before else None
        deadline = decisions.notice_deadline(not_before, time.time())
        self.state.notice = EvictionNotice(fact.event_id, deadline, source=fact.source)
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
        if self.config.imds_url is None or self.config.cloud != "azure" or notice is None:
            return  # only Azure takes an acknowledgement; AWS and GCP evict at their own time
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


async def in_daemon_thread(call: Callable[[], T]) -> T:
    """``call()`` in a daemon thread of its own: a hanging GET (GCP's) must not hold up the agent's exit, as a
    thread of asyncio's default executor would (``asyncio.run`` waits for those)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if future.done():
            return  # the watch was cancelled meanwhile
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def run() -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = call()
        except BaseException as exc:  # handed to the awaiting task, which decides
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: the agent is gone
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="notices", daemon=True).start()
    return await future
