"""Asking the provider for capacity: the pure level and retry decision, and the runner performing it.

The runner side runs on a real store with the FakeProvider and an injected clock: a request is made
after the decision is persisted, its outcome comes back as an event, and nothing is asked twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from controller.core import capacity
from controller.core import intake as agents
from controller.core.events import EventKind
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Command, NodeObservation, RequestCapacity, World
from controller.core.reconcile import Config
from controller.eventlog.provider_facts import LocalVmsStarted
from controller.persistence.store import Store
from controller.providers.base import ProviderInbox, StaticProvider
from controller.shell.runner import Runner, RunnerSettings
from tests.controller.helpers import FakeProvider, job, node, spec, write_profile

J, N = JobState, NodeState


@dataclass
class Clock:
    at: float = 100.0

    def now(self) -> float:
        return self.at


def test_the_wanted_level_is_busy_slots_plus_what_queued_jobs_need() -> None:
    nodes = {
        "a": node("a", N.ASSIGNED, slots=2, job="run"),
        "b": node("b", N.DRAINING, slots=1, job="run"),
        "d": node("d", N.LOST, slots=8, job="run"),  # its VM is likely dead
        "e": node("e", N.JOINING, slots=16),  # not free yet
    }
    jobs = {"run": job("run", J.RUNNING), "q1": job("q1"), "q2": job("q2"), "done": job("done", J.SUCCEEDED)}
    assert capacity.busy_nodes(nodes) == {"a", "b"}
    assert capacity.wanted_slots(World(nodes, jobs)) == 2 + 1 + 2 * 1
    free = {**nodes, "c": node("c", N.READY, slots=4)}
    assert capacity.wanted_slots(World(free, jobs)) == 2 + 1 + 4  # the free node is kept for them
    assert capacity.wanted_slots(World(free, {"run": jobs["run"]})) == 2 + 1  # nobody waits: it may go


def test_a_level_is_asked_once_and_again_only_when_it_changes_or_a_refusal_is_old_enough() -> None:
    empty, queued = World({}, {}), World({}, {"q": job("q")})
    assert capacity.next_ask(empty, 0.0, None, 30) is None  # nothing wanted, nothing said
    assert capacity.next_ask(queued, 0.0, None, 30) == RequestCapacity(1)
    asked = capacity.CapacityAsk(1, at=0.0)
    assert capacity.next_ask(queued, 1e6, asked, 30) is None
    assert capacity.next_ask(empty, 1.0, asked, 30) == RequestCapacity(0)  # the job left: say so
    refused = capacity.CapacityAsk(1, at=0.0, failed=True)
    assert capacity.next_ask(queued, 29.9, refused, 30) is None
    assert capacity.next_ask(queued, 30.0, refused, 30) == RequestCapacity(1)


Scenario = Callable[[Runner, Clock, Store], Awaitable[None]]
DEFAULTS = Config()


def run(tmp_path: Path, provider: FakeProvider | StaticProvider, scenario: Scenario, config: Config = DEFAULTS) -> None:
    async def main() -> None:
        clock = Clock()
        store = Store(tmp_path / "state.db")
        inbox = ProviderInbox(clock)
        runner = Runner(store, clock, config, provider, inbox, RunnerSettings(coalesce_seconds=0.0))
        try:
            await scenario(runner, clock, store)
        finally:
            await runner.close()
            store.close()

    asyncio.run(main())


def register(name: str) -> Callable[[World, float], list[Command]]:
    return lambda world, now: agents.register(world, name, 1, "h", now)[1]


def kinds(store: Store) -> list[str]:
    return [e.kind for e in store.events()]


def test_a_queued_job_asks_the_provider_once_and_the_outcome_is_logged(tmp_path: Path) -> None:
    provider = FakeProvider()

    async def scenario(runner: Runner, clock: Clock, store: Store) -> None:
        await runner.submit(spec(min_gpus=3, profile=str(write_profile(tmp_path))))
        await runner.settle()
        clock.at += 60
        await runner.tick()
        await runner.settle()
        assert provider.requested == [3]
        [event] = [e for e in store.events() if e.kind == "CapacityRequested"]
        assert event.data == {"slots": 3} and event.at == 100.0

    run(tmp_path, provider, scenario)


def test_a_refused_request_is_an_event_and_asked_again_after_the_retry_time(tmp_path: Path) -> None:
    provider = FakeProvider(fail_requests=True)

    async def scenario(runner: Runner, clock: Clock, store: Store) -> None:
        await runner.submit(spec(min_gpus=2, profile=str(write_profile(tmp_path))))
        await runner.settle()
        assert kinds(store).count("ProviderCapacityRequestFailed") == 1
        clock.at += runner.settings.capacity_retry_seconds - 1
        await runner.tick()
        await runner.settle()
        assert provider.requested == [2]
        clock.at += 1
        await runner.tick()
        await runner.settle()
        assert provider.requested == [2, 2]
        assert "cannot provide 2 slots" in store.events()[-1].data["error"]

    run(tmp_path, provider, scenario)


def test_busy_nodes_are_published_to_the_port_after_each_commit(tmp_path: Path) -> None:
    provider = FakeProvider()

    async def scenario(runner: Runner, clock: Clock, store: Store) -> None:
        for name in ("n1", "n2"):
            await runner.decide(register(name))
            await runner.observe(name, NodeObservation(1, clock.now()))
        assert not runner.inbox.busy("n1")
        await runner.submit(spec(min_gpus=2, profile=str(write_profile(tmp_path))))
        assert runner.inbox.busy("n1") and runner.inbox.busy("n2")
        await runner.settle()
        assert provider.requested == [2]  # two free nodes held by the job now: the level is theirs

    run(tmp_path, provider, scenario, Config(debounce_seconds=0.0))


def test_provider_reports_are_logged_when_they_happened_even_without_a_list(tmp_path: Path) -> None:
    async def scenario(runner: Runner, clock: Clock, store: Store) -> None:
        await runner.decide(register("n1"))
        runner.inbox.report(LocalVmsStarted(["vm-9"], 1, "at 100"))
        clock.at += 5
        await runner.poll_provider()  # a static cluster cannot list: nothing is GONE, the report is logged
        assert runner.nodes["n1"].state is N.JOINING
        event = store.events()[-1]
        assert (event.kind, event.at, event.data) == (
            EventKind.LOCAL_VMS_STARTED,
            100.0,
            {"vms": ["vm-9"], "slots": 1, "message": "at 100"},
        )

    run(tmp_path, StaticProvider(), scenario)


def test_unlisted_nodes_are_gone_and_closing_the_runner_closes_the_provider(tmp_path: Path) -> None:
    provider = FakeProvider(frozenset({"n1"}))

    async def scenario(runner: Runner, clock: Clock, store: Store) -> None:
        await runner.decide(register("n2"))
        await runner.poll_provider()
        assert runner.nodes["n2"].state is N.GONE  # not listed by the provider

    run(tmp_path, provider, scenario)
    assert provider.closed
