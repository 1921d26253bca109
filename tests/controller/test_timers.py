"""The timers: registered with fixed ids at start, and their callbacks drive the runner's decisions.

No test waits for a timer to fire: the scheduler's registered job functions are called directly, and
the runner's clock is a value the test moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from controller.app.timers import CHECKPOINT_REQUESTS, DEBOUNCE, HEARTBEAT_EXPIRY, PROVIDER_POLL, TimerConfig, Timers
from controller.core import intake as agents
from controller.core.lifecycle import NodeState
from controller.core.model import NodeObservation
from controller.core.reconcile import Config
from controller.persistence.store import Store
from controller.providers.base import StaticProvider
from controller.shell.runner import Runner


class FakeClock:
    def __init__(self, at: float = 1000.0) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


def test_only_enabled_timers_are_registered_with_fixed_ids_and_intervals() -> None:
    calls: list[str] = []

    def tick(name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            calls.append(name)

        return run

    async def scenario() -> None:
        timers = Timers(TimerConfig(expiry_check_seconds=1.0, debounce_check_seconds=2.0, provider_poll_seconds=30))
        timers.start(expiry=tick("expiry"), debounce=tick("debounce"), checkpoints=tick("ckpt"), poll=tick("poll"))
        try:
            assert timers.ids() == sorted([HEARTBEAT_EXPIRY, DEBOUNCE, PROVIDER_POLL])  # checkpoints: 0 = off
            jobs = {job.id: job for job in timers.scheduler.get_jobs()}
            intervals = {job_id: job.trigger.interval.total_seconds() for job_id, job in jobs.items()}
            assert intervals == {HEARTBEAT_EXPIRY: 1.0, DEBOUNCE: 2.0, PROVIDER_POLL: 30.0}
            assert all(job.max_instances == 1 and job.coalesce for job in jobs.values())
            for job_id in sorted(jobs):  # what the scheduler would run, run by hand
                await jobs[job_id].func()
            assert sorted(calls) == ["debounce", "expiry", "poll"]
        finally:
            timers.stop()
        await asyncio.sleep(0)  # AsyncIOScheduler shuts down in a loop callback
        assert not timers.scheduler.running
        timers.stop()  # stopping a stopped scheduler is harmless

    asyncio.run(scenario())


def test_checkpoint_timer_is_registered_when_enabled() -> None:
    async def nothing() -> None:
        return None

    async def scenario() -> None:
        timers = Timers(TimerConfig(checkpoint_request_seconds=600))
        timers.start(expiry=nothing, debounce=nothing, checkpoints=nothing, poll=nothing)
        try:
            assert CHECKPOINT_REQUESTS in timers.ids() and PROVIDER_POLL not in timers.ids()
        finally:
            timers.stop()

    asyncio.run(scenario())


def test_expiry_timer_marks_a_silent_node_lost(tmp_path: Path) -> None:
    """The heartbeat-expiry job, driven by hand with a moved clock, makes a silent node LOST."""

    async def scenario() -> None:
        clock = FakeClock()
        store = Store(tmp_path / "state.db")
        runner = Runner(store, clock, Config(heartbeat_expiry_seconds=10.0), StaticProvider())
        timers = Timers(TimerConfig())
        timers.start(
            expiry=runner.tick, debounce=runner.tick, checkpoints=runner.request_checkpoints, poll=runner.poll_provider
        )
        try:
            await runner.decide(lambda world, now: agents.register(world, "n1", 1, "127.0.0.1", now)[1])
            await runner.observe("n1", NodeObservation(1, clock.now()))
            states = [runner.nodes["n1"].state]
            expiry = timers.scheduler.get_job(HEARTBEAT_EXPIRY)
            clock.at += 9.0
            await expiry.func()
            states.append(runner.nodes["n1"].state)  # within the window
            clock.at += 2.0
            await expiry.func()
            states.append(runner.nodes["n1"].state)
            assert states == [NodeState.READY, NodeState.READY, NodeState.LOST]
        finally:
            timers.stop()
            store.close()

    asyncio.run(scenario())


def test_a_registration_brings_the_provider_poll_forward_to_now() -> None:
    """A VM that registers is listed by its provider at once (its pool known before arrivals settle), not at the
    poll's next interval; with no poll (a provider never polled) or stopped timers it is a no-op."""

    async def nothing() -> None:
        return None

    async def scenario() -> None:
        timers = Timers(TimerConfig(provider_poll_seconds=3600))
        timers.start(expiry=nothing, debounce=nothing, checkpoints=nothing, poll=nothing)
        try:
            job = timers.scheduler.get_job(PROVIDER_POLL)
            assert job is not None
            before = job.next_run_time
            now = datetime.now(before.tzinfo)
            assert (before - now).total_seconds() > 3000
            timers.poll_soon()
            after = timers.scheduler.get_job(PROVIDER_POLL).next_run_time
            assert (after - now).total_seconds() < 5, (before, after)
            assert timers.scheduler.get_job(PROVIDER_POLL).trigger.interval.total_seconds() == 3600  # still hourly
        finally:
            timers.stop()
        unpolled = Timers(TimerConfig())
        unpolled.start(expiry=nothing, debounce=nothing, checkpoints=nothing, poll=nothing)
        unpolled.poll_soon()
        assert PROVIDER_POLL not in unpolled.ids()
        unpolled.stop()
        await asyncio.sleep(0)
        timers.poll_soon()  # stopped: nothing to bring forward

    asyncio.run(scenario())
