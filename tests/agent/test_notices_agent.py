"""The agent with another cloud's notices: AWS's early warning rides on every heartbeat until withdrawn, and on GCP
a SIGTERM (the guest's shutdown) is a notice first, the agent exiting once its trainers have left. Real gRPC servers
and a real local metadata service in this process; the trainers are a fake supervisor's reports."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.local.aws_metadata import AwsMetadataServer
from tests.agent.fake_controllers import NODE_TOKEN, FakeController, FakeSupervisor, serving
from worker_agent.agent.converge import Assignment, TrainerKey
from worker_agent.agent.daemon import Agent, AgentConfig
from worker_agent.agent.decisions import EvictionNotice, EvictionRisk, drained
from worker_agent.agent.wire import Registration, heartbeat_to_pb, report_to_pb
from worker_agent.commands import agent as agent_command
from worker_agent.notices.aws import RISK_SOURCE
from worker_agent.notices.facts import CLOUDS, Cloud
from worker_agent.notices.gcp import SHUTDOWN_ID, SHUTDOWN_SOURCE

KEYS = [TrainerKey("job-1", 3, rank) for rank in (0, 1)]
NODE = Registration("node-1", 1, NODE_TOKEN, 1.0, 10.0)


def agent_of(tmp_path: Path, leader: FakeController, cloud: Cloud, imds_url: str | None = None) -> Agent:
    """A registered agent of ``cloud`` whose two trainers of job-1 train."""
    config = AgentConfig((leader.address,), "agent-token", tmp_path, imds_url=imds_url, cloud=cloud, poll_seconds=0.05)
    agent = Agent(config)
    agent.supervisor = FakeSupervisor.training(*KEYS)  # type: ignore[assignment]
    agent.state.node = NODE
    agent.state.desired = Assignment("job-1", 3, "run", (0, 1))
    agent.state.last_contact = time.monotonic()
    return agent


async def beat_until(agent: Agent, condition: Callable[[], bool]) -> None:
    while not condition():
        await agent._beat()
        await asyncio.sleep(0.02)


def test_an_aws_rebalance_recommendation_rides_on_every_heartbeat_until_withdrawn(tmp_path: Path) -> None:
    metadata = AwsMetadataServer().start()
    try:
        with serving() as start:
            leader = start()
            agent = agent_of(tmp_path, leader, "aws", f"{metadata.base_url}/vm-1")

            def last_risk() -> pb.EvictionRisk | None:
                beat = leader.heartbeats[-1] if leader.heartbeats else None
                return beat.risk if beat is not None and beat.HasField("risk") else None

            async def scenario() -> None:
                watching = asyncio.create_task(agent.evictions.watch())
                await agent._beat()
                assert last_risk() is None
                metadata.state.recommend_rebalance("vm-1")
                await asyncio.wait_for(beat_until(agent, lambda: last_risk() is not None), 20)
                await agent._beat()
                risk = last_risk()
                assert risk is not None and risk.source == RISK_SOURCE, "every beat, not once"
                assert abs(risk.noticed_at - time.time()) < 30
                assert agent.state.notice is None, "a warning is no notice: nothing stops"
                metadata.state.withdraw_rebalance("vm-1")
                await asyncio.wait_for(beat_until(agent, lambda: last_risk() is None), 20)
                watching.cancel()
                await agent.link.close()

            asyncio.run(scenario())
    finally:
        metadata.stop()


def test_on_gcp_a_sigterm_is_a_notice_and_the_agent_exits_once_its_trainers_left(tmp_path: Path) -> None:
    with serving() as start:
        leader = start()
        agent = agent_of(tmp_path, leader, "gcp")
        supervisor: FakeSupervisor = agent.supervisor  # type: ignore[assignment]

        async def scenario() -> None:
            agent._terminated()
            assert not agent._stopping, "the first SIGTERM is a notice, not an exit"
            assert agent._draining is not None
            await asyncio.wait_for(agent._draining, 20)  # the notice's push (a ReportEvent)
            assert agent.state.notice_heard()
            notice = agent.state.notice
            assert notice is not None and notice.event_id == SHUTDOWN_ID and notice.source == SHUTDOWN_SOURCE
            assert notice.not_before > time.time() + 20
            agent._exit_if_drained()
            assert not agent._stopping, "its trainers still run: the controller hands their work off first"
            supervisor.request_stop("job-1", 3, leaving=True)  # as the controller's stop of this leaving node does
            agent._exit_if_drained()
            assert not agent._stopping, "they left, but no controller has heard how: it would take them for lost"
            await agent._beat()
            told = leader.heartbeats[-1]
            assert [(t.running, t.exit_code) for t in told.trainers] == [(False, 0), (False, 0)]
            agent._exit_if_drained()
            assert agent._stopping
            await agent.link.close()

        asyncio.run(scenario())
    assert leader.reported(), "the notice was pushed at once (ReportEvent), as any notice is"
    assert supervisor.killed == []


@pytest.mark.parametrize("cloud", ["azure", "aws"])
def test_elsewhere_a_sigterm_stops_the_agent_at_once(tmp_path: Path, cloud: Cloud) -> None:
    with serving() as start:
        agent = agent_of(tmp_path, start(), cloud)
        agent._terminated()
        assert agent._stopping and agent.state.notice is None


def test_on_gcp_a_second_sigterm_or_the_shutdowns_end_stops_it_at_once(tmp_path: Path) -> None:
    with serving() as start:
        leader = start()

        async def twice() -> Agent:
            agent = agent_of(tmp_path, leader, "gcp")
            agent._terminated()
            agent._terminated()
            await agent.link.close()
            return agent

        assert asyncio.run(twice())._stopping

        async def late() -> Agent:
            agent = agent_of(tmp_path, leader, "gcp")
            agent._terminated()
            assert agent._drain_until is not None
            agent._drain_until = time.time() - 1  # the 30 s are up (the platform is about to take the VM)
            agent._exit_if_drained()
            await agent.link.close()
            return agent

        assert asyncio.run(late())._stopping, "trainers still running do not keep it past the shutdown"


def test_drained_waits_for_the_trainers_and_a_controller_or_the_deadline() -> None:
    notice = EvictionNotice("gcp-shutdown", 130.0)
    assert drained(notice, heard=True, untold=False, running=False, now=100.0, until=130.0)
    assert not drained(notice, heard=True, untold=False, running=True, now=100.0, until=130.0)
    assert not drained(notice, heard=False, untold=False, running=False, now=100.0, until=130.0)
    assert not drained(notice, heard=True, untold=True, running=False, now=100.0, until=130.0), (
        "trainers that stopped alone wait for a controller to hear how, while the VM lasts"
    )
    assert drained(notice, heard=False, untold=True, running=True, now=130.0, until=130.0)
    assert not drained(None, heard=False, untold=False, running=False, now=100.0, until=130.0)


def test_the_wire_carries_the_risk_and_each_notice_source() -> None:
    notice = EvictionNotice("aws-terminate-x", 99.0, source="aws-spot-instance-action")
    beat = heartbeat_to_pb(NODE, [], notice, risk=EvictionRisk(RISK_SOURCE, 42.0))
    assert (beat.eviction.source, beat.risk.source, beat.risk.noticed_at) == (notice.source, RISK_SOURCE, 42.0)
    assert report_to_pb(NODE, notice).eviction.source == "aws-spot-instance-action"
    assert not heartbeat_to_pb(NODE, [], None).HasField("risk")


def test_the_agent_command_takes_a_cloud_and_azure_is_the_default() -> None:
    parser = argparse.ArgumentParser()
    agent_command.add_arguments(parser)
    assert parser.parse_args([]).cloud == "azure"
    assert [parser.parse_args(["--cloud", c]).cloud for c in CLOUDS] == list(CLOUDS)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cloud", "oracle"])
