"""Several controllers, one leading: the agent's link calls the leader, moves on when a call does not reach one
(to the leader a standby names, else the next address in turn) at the loop's own cadence, never registers again
for it, and acts on no reply of a deposed leader (an older epoch). Real gRPC servers in this process with a
small fake Agent servicer (:mod:`tests.agent.fake_controllers`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from protos.spotmorph.v1 import controller_pb2 as pb
from tests.agent.fake_controllers import NODE_TOKEN, FakeSupervisor, serving, silent_address
from tests.agent.test_transport import OFFER, FakeClock
from worker_agent.agent.converge import Assignment, TrainerKey
from worker_agent.agent.daemon import Agent, AgentConfig
from worker_agent.agent.transport import (
    MAX_OTHER_CHANNELS,
    ControllerLink,
    ControllerUnreachable,
    Endpoint,
    NotLeader,
)
from worker_agent.agent.wire import Registration

NODE = Registration("node-1", 1, NODE_TOKEN, 1.0, 10.0)


def test_a_standby_sends_the_call_to_the_leader_it_names_even_one_not_in_the_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serving() as start:
        leader = start(epoch=4, replies=[pb.HeartbeatResponse(heartbeat_interval_seconds=2.5)])
        standby = start(standby=True, leader=leader.address)

        async def beats() -> list[float | None]:
            link = ControllerLink(Endpoint((standby.address,)))  # the leader is not in the list
            try:
                first = await link.heartbeat(NODE, [], None)
                second = await link.heartbeat(NODE, [], None)
                assert link.address == leader.address and link.fence.newest == 4
                return [first.heartbeat_interval, second.heartbeat_interval]
            finally:
                await link.close()

        with caplog.at_level(logging.WARNING, logger="spotmorph.agent"):
            intervals = asyncio.run(beats())
    assert intervals == [2.5, None], "the refused call was followed to the leader at once, and the next went there"
    assert standby.methods() == ["Heartbeat"] and leader.methods() == ["Heartbeat", "Heartbeat"]
    # The node token is good at every controller: nothing registered again on the way.
    assert {token for _, token in standby.calls + leader.calls} == {NODE_TOKEN}
    assert f"controller {leader.address} leads now ({standby.address} said not-leader)" in caplog.text


def test_an_unreachable_controller_moves_the_next_call_to_the_next_address_in_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    silent = silent_address()
    with serving() as start:
        going = start(down=True)
        leader = start(epoch=2)

        async def beats() -> list[str]:
            link = ControllerLink(Endpoint((silent, going.address, leader.address)))
            seen = []
            try:
                for _ in range(4):
                    try:
                        await link.heartbeat(NODE, [], None)
                        seen.append(f"answered by {link.address}")
                    except ControllerUnreachable as exc:
                        seen.append(str(exc).split(":")[0])
            finally:
                await link.close()
            return seen

        with caplog.at_level(logging.WARNING, logger="spotmorph.agent"):
            seen = asyncio.run(beats())
    # One call per beat: a failure moves the next call on, it never retries at once (the loop's cadence decides).
    assert seen == ["UNAVAILABLE", "UNAVAILABLE", f"answered by {leader.address}", f"answered by {leader.address}"]
    assert going.methods() == ["Heartbeat"] and leader.methods() == ["Heartbeat", "Heartbeat"]
    assert f"controller {silent} does not answer (UNAVAILABLE); trying {going.address}" in caplog.text
    assert f"controller {going.address} does not answer (UNAVAILABLE); trying {leader.address}" in caplog.text


def test_registration_looks_for_the_leader_at_its_backoff_cadence() -> None:
    silent = silent_address()
    with serving() as start:
        standby = start(standby=True)  # knows no leader: the next address in turn
        leader = start(epoch=1)
        clock = FakeClock()

        async def register() -> Registration | None:
            link = ControllerLink(Endpoint((silent, standby.address, leader.address)), sleep=clock.sleep)
            try:
                return await link.register(OFFER, "agent-token", lambda: False, max_backoff=5.0)
            finally:
                await link.close()

        node = asyncio.run(register())
    assert node is not None and node.node_token == NODE_TOKEN
    assert clock.slept == [0.2, 0.4], "each address tried once, after the backoff as before"
    assert standby.methods() == ["Register"] and leader.methods() == ["Register"]


def test_standbys_naming_each_other_cost_one_redirect_a_call() -> None:
    with serving() as start:
        first = start(standby=True)
        second = start(standby=True, leader=first.address)
        first.leader = second.address

        async def beat() -> None:
            link = ControllerLink(Endpoint((first.address,)))
            try:
                for _ in range(3):
                    with pytest.raises(NotLeader):
                        await link.heartbeat(NODE, [], None)
            finally:
                await link.close()

        asyncio.run(beat())
    assert len(first.calls) + len(second.calls) == 6, "two calls a beat at most, never a loop between them"


def test_a_reply_older_than_the_newest_epoch_is_not_acted_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A deposed leader (epoch 3, it does not know yet) answers a heartbeat with no assignment, which would stop
    the node's trainers: the agent refuses the reply whole, says so once, and moves on to find the leader."""
    with serving() as start:
        leader = start(epoch=5)
        deposed = start(epoch=3, replies=[pb.HeartbeatResponse(heartbeat_interval_seconds=0.01)] * 3)
        trainer = TrainerKey("job-1", 7, 0)
        supervisor = FakeSupervisor.training(trainer)
        agent = Agent(AgentConfig((leader.address, deposed.address), "agent-token", tmp_path))
        agent.supervisor = supervisor  # type: ignore[assignment]

        async def scenario() -> list[str]:
            try:
                await agent._register()
                agent.state.desired = Assignment("job-1", 7, "run", (0,))
                leader.down = True  # it stops leading: the next beat moves on
                outcomes = []
                for _ in range(5):
                    await agent._beat()
                    outcomes.append(agent.link.address)
                assert supervisor.killed == [], "not one of its replies was applied"
                deposed.epoch = 6  # elected again since: its replies are the leader's now
                await agent._beat()
                return outcomes
            finally:
                await agent.link.close()

        with caplog.at_level(logging.WARNING, logger="spotmorph.agent"):
            outcomes = asyncio.run(scenario())
    assert outcomes == [deposed.address, leader.address] * 2 + [deposed.address]
    assert deposed.methods() == ["Heartbeat"] * 3 and leader.methods() == ["Register"] + ["Heartbeat"] * 3
    # Epoch 6 is newer: that reply is acted on (it assigns nothing here, so the trainer goes).
    assert supervisor.killed == [trainer] and agent.state.interval == 0.01 and agent.link.fence.newest == 6
    refusals = [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert "leader epoch 3 is older than epoch 5" in refusals[0] and deposed.address in refusals[0]
    assert f"controller {deposed.address} answered with the stale epoch 3; trying {leader.address}" in caplog.text


def test_a_registration_a_deposed_leader_answers_is_refused_and_the_leader_found(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serving() as start:
        leader = start(epoch=5)
        deposed = start(epoch=3)

        async def register() -> Registration | None:
            slept: list[float] = []

            async def leader_back(seconds: float) -> None:
                slept.append(seconds)
                leader.down = False

            link = ControllerLink(Endpoint((leader.address, deposed.address)), sleep=leader_back)
            try:
                await link.heartbeat(NODE, [], None)  # epoch 5 seen
                leader.down = True
                with pytest.raises(ControllerUnreachable):
                    await link.heartbeat(NODE, [], None)  # moves on to the deposed one
                node = await link.register(OFFER, "agent-token", lambda: False, max_backoff=5.0)
                assert slept == [0.2] and link.address == leader.address
                return node
            finally:
                await link.close()

        with caplog.at_level(logging.WARNING, logger="spotmorph.agent"):
            node = asyncio.run(register())
    assert node is not None and deposed.methods() == ["Register"] and leader.methods()[-1] == "Register"
    assert "refusing" in caplog.text and "Register reply: leader epoch 3 is older than epoch 5" in caplog.text


def test_leaders_named_outside_the_list_keep_a_bounded_number_of_channels() -> None:
    with serving() as start:
        standby = start(standby=True)

        async def beats() -> int:
            link = ControllerLink(Endpoint((standby.address,)))
            try:
                for _ in range(MAX_OTHER_CHANNELS + 4):
                    standby.leader = silent_address()  # a new one each time, none answering
                    with pytest.raises(ControllerUnreachable):
                        await link.heartbeat(NODE, [], None)
                    assert link.address == standby.address, "back to the list after the named one failed"
                return len(link._channels)
            finally:
                await link.close()

        open_channels = asyncio.run(beats())
    assert open_channels <= 1 + MAX_OTHER_CHANNELS + 1
