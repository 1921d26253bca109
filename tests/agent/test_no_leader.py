"""No leader, no harm: with no controller answering at all, the trainers keep training, and an eviction notice
still makes the agent act, on its own, as the controller would have (its trainers stop at the next step
boundary, leaving); the first heartbeat a controller answers afterwards carries the notice and how they stopped.
A real metadata service and real gRPC servers in this process; the trainers are a fake supervisor's reports (a
leaving stop's own behaviour, checkpoint and exit 0: tests/agent/test_supervisor.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from spotmorph.local.imds_server import ScheduledEventsServer, ScheduledEventsState
from tests.agent.fake_controllers import NODE_TOKEN, FakeController, FakeSupervisor, port_of, serving, silent_address
from worker_agent.agent.converge import Assignment, TrainerKey
from worker_agent.agent.daemon import Agent, AgentConfig
from worker_agent.agent.decisions import EvictionNotice
from worker_agent.agent.wire import Registration

VM = "node-1"
KEYS = [TrainerKey("job-1", 3, rank) for rank in (0, 1)]


@pytest.fixture
def imds() -> Iterator[ScheduledEventsServer]:
    server = ScheduledEventsServer(state=ScheduledEventsState()).start()
    yield server
    server.stop()


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.02)


async def beat_until(
    agent: Agent, condition: Callable[[], bool], call: Callable[[], Awaitable[object]] | None = None
) -> None:
    """Beat (``call``: or call that) until ``condition``; each failure moves on to the next address, and a channel
    may be in its reconnect backoff a while."""
    while not condition():
        await (call or agent._beat)()
        await asyncio.sleep(0.02)


def agent_without_a_controller(tmp_path: Path, imds: ScheduledEventsServer) -> tuple[Agent, FakeSupervisor]:
    """A registered agent whose two trainers of job-1 train, none of its controllers answering any more."""
    addresses = (silent_address(), silent_address())
    config = AgentConfig(
        addresses, "agent-token", tmp_path, imds_url=imds.base_url, vm_name=VM, poll_seconds=0.01, alone_after_seconds=0
    )
    agent = Agent(config)
    supervisor = FakeSupervisor.training(*KEYS)
    agent.supervisor = supervisor  # type: ignore[assignment]
    agent.state.node = Registration(VM, 1, NODE_TOKEN, 1.0, 10.0)
    agent.state.desired = Assignment("job-1", 3, "run", (0, 1))
    agent.state.last_contact = time.monotonic()
    return agent, supervisor


def test_with_no_controller_a_notice_still_stops_the_trainers_and_a_returning_leader_hears_how(
    tmp_path: Path, imds: ScheduledEventsServer, caplog: pytest.LogCaptureFixture
) -> None:
    agent, supervisor = agent_without_a_controller(tmp_path, imds)
    returning: list[FakeController] = []

    async def scenario() -> None:
        for _ in range(4):
            await agent._beat()
        assert supervisor.killed == [] and supervisor.stops == [], "a controller gone stops no trainer"
        assert all(r.status.running for r in supervisor.reports())
        watching = asyncio.create_task(agent.evictions.watch())
        imds.state.schedule("Preempt", [VM], notice_seconds=30)
        await asyncio.wait_for(until(lambda: bool(supervisor.stops)), 20)
        assert supervisor.stops == [("job-1", 3, True)], "stopped on its own, leaving"
        await agent._beat()
        assert imds.state.admin_view()[0]["Acknowledged"] is False, "the VM stays until a controller heard"
        with serving() as start:
            leader = start(port=port_of(agent.config.controllers[1]), epoch=2)
            returning.append(leader)
            await asyncio.wait_for(beat_until(agent, lambda: bool(leader.heartbeats)), 20)
            await agent._beat()  # nothing runs, a controller heard: the platform may evict now
            await asyncio.wait_for(until(lambda: bool(imds.state.admin_view()[0]["Acknowledged"])), 20)
        watching.cancel()

    with caplog.at_level(logging.INFO, logger="spotmorph.agent"):
        asyncio.run(scenario())
    assert supervisor.killed == [], "no trainer was killed at any point"
    told = returning[0].heartbeats[0]
    assert told.HasField("eviction") and told.eviction.not_before > time.time()
    assert [(t.rank, t.running, t.exit_code, t.last_checkpoint_step) for t in told.trainers] == [
        (0, False, 0, 41),
        (1, False, 0, 41),
    ]
    assert "Register" not in returning[0].methods(), "the same incarnation goes on at the new leader"
    assert "no controller has heard of eviction notice" in caplog.text and "stops here on its own" in caplog.text
    assert f"controller {returning[0].address} answers again: this heartbeat told it of eviction notice" in caplog.text


def test_a_notice_a_controller_heard_of_is_left_to_it(tmp_path: Path, imds: ScheduledEventsServer) -> None:
    agent, supervisor = agent_without_a_controller(tmp_path, imds)
    notice = EvictionNotice("e-1", time.time() + 30)
    with serving() as start:
        leader = start(port=port_of(agent.config.controllers[0]), epoch=1)

        async def scenario() -> None:
            agent.state.notice, agent.state.noticed_at = notice, time.monotonic()
            await asyncio.wait_for(beat_until(agent, leader.reported, lambda: agent._report(notice)), 20)
            agent._stop_alone_if_due()  # due by the clock (alone_after_seconds=0), but a controller heard
            await agent.link.close()

        asyncio.run(scenario())
    assert agent.state.notice_heard() and supervisor.stops == [] and supervisor.killed == []
