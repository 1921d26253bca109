"""A trainer's poke wakes its agent: the FIFO's two ends, and an agent whose poll would wait ten minutes hearing
at once that its real trainers stopped and hold their state, or exited."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.agent.test_supervisor import spec
from tests.runtime.helpers import wait_for
from tests.zygotes import NodeZygote
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.daemon import Agent, AgentConfig
from worker_agent.agent.wire import Registration
from worker_agent.contract.wake import WAKE_ENV, WakeFifo, poke


def test_a_poke_reaches_the_agents_fifo_and_is_read_once(tmp_path: Path) -> None:
    fifo = WakeFifo(tmp_path / "trainers" / "wake")
    env = {WAKE_ENV: str(fifo.path)}
    assert poke(env) and poke(env)
    assert fifo.drain() == 2 and fifo.drain() == 0
    fifo.close()
    assert not fifo.path.exists()


def test_a_poke_with_nowhere_to_go_is_dropped_without_blocking_or_writing(tmp_path: Path) -> None:
    assert not poke({})  # a trainer not started by an agent (`spotmorph train`, a test)
    assert not poke({WAKE_ENV: str(tmp_path / "missing")})
    plain = tmp_path / "plain"
    plain.write_text("keep")
    assert not poke({WAKE_ENV: str(plain)}) and plain.read_text() == "keep"  # a forged name: never a file
    unread = tmp_path / "unread"
    os.mkfifo(unread)
    assert not poke({WAKE_ENV: str(unread)})  # no agent holds it open: ENXIO, not a wait


def test_a_full_fifo_drops_the_poke_and_the_agent_reads_what_is_there(tmp_path: Path) -> None:
    fifo = WakeFifo(tmp_path / "wake")
    env = {WAKE_ENV: str(fifo.path)}
    sent = 0
    while poke(env):  # the pipe fills (64 KiB on Linux) and the writer is told EAGAIN, never blocked
        sent += 1
    assert sent > 0 and fifo.drain() == sent
    assert poke(env)
    fifo.close()


def test_a_stale_fifo_is_made_afresh(tmp_path: Path) -> None:
    stale = tmp_path / "wake"
    stale.write_text("left by an earlier incarnation")
    fifo = WakeFifo(stale)
    assert poke({WAKE_ENV: str(stale)}) and fifo.drain() == 1
    fifo.close()


@pytest.mark.slow
@pytest.mark.parametrize("memory", [True, False], ids=["held", "exited"])
def test_stopped_trainers_end_the_agents_pause_before_its_poll_would(
    tmp_path: Path, memory: bool, node_zygote: NodeZygote
) -> None:
    """The agent looks at its trainers every ten minutes here: the pause ends only because the trainers that
    stopped and hold their state poked it (``held``), or because they exited: SIGCHLD (``exited``)."""
    config = AgentConfig(("fake:1",), "t", tmp_path / "agent", local_poll_seconds=600.0, warm_trainers=1)
    agent = Agent(replace(config, zygote=node_zygote()))  # a CPU node's, which forks its trainers
    agent.state.node = Registration("node-1", 1, "node-token", 600.0, 1800.0)
    agent.state.interval = 600.0
    launch = spec(tmp_path, steps=100_000, memory=memory)

    async def stop_then_pause() -> None:
        agent.wakeup.listen()
        for rank in range(2):
            agent.supervisor.start(TrainerKey("job-1", 1, rank), launch)
        await asyncio.to_thread(
            wait_for, lambda: all(r.step >= 3 for r in agent.supervisor.reports()), 90, "three steps on both ranks"
        )
        assert agent.supervisor.running()
        agent.supervisor.request_stop("job-1", 1)
        await asyncio.wait_for(agent._pause(), 90)
        agent.wakeup.close()

    try:
        asyncio.run(stop_then_pause())
        assert agent.supervisor.exited_since(set()), "the pause ended because a trainer's generation ended"
        assert [r.status.exit_code for r in agent.supervisor.reports() if not r.status.running] in ([0], [0, 0])
    finally:
        agent.supervisor.kill_all()
