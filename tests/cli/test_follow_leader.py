"""Several controllers, one leading: the CLI reads from the first that answers, and a write a standby refuses
(FAILED_PRECONDITION, reason not-leader) lands on the leader exactly once, with the same idempotency key;
when none leads, one line and exit 5. Real gRPC servers in this process, with small fake Jobs servicers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from controller.client import connection
from controller.client.commands.common import EXIT_UNAVAILABLE
from controller.client.leader import LeaderChannel, Route
from protos.reasons import LEADER_KEY, NOT_LEADER, REASON_KEY
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from spotmorph.cli import main
from tests.cli.test_controller_unreachable import free_port
from tests.cli.test_submit_input import EXAMPLE


@dataclass
class FakeJobs(rpc.JobsServicer):
    """A controller's Jobs service: a leader does writes; a standby refuses them naming ``leader``."""

    leads: bool
    leader: str = ""
    address: str = ""
    submitted: list[str] = field(default_factory=list)  # the idempotency key of each SubmitJob that came
    cancelled: list[str] = field(default_factory=list)
    listed: int = 0

    def _write(self, context: grpc.ServicerContext) -> None:
        if not self.leads:
            context.set_trailing_metadata(((REASON_KEY, NOT_LEADER), (LEADER_KEY, self.leader)))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this controller is a standby")

    def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.ServicerContext) -> pb.SubmitJobResponse:
        self.submitted.append(request.idempotency_key)
        self._write(context)
        return pb.SubmitJobResponse(id="job-1")

    def CancelJob(self, request: pb.CancelJobRequest, context: grpc.ServicerContext) -> pb.Job:
        self.cancelled.append(request.id)
        self._write(context)
        return pb.Job(id=request.id, state=pb.JOB_STATE_CANCELLED)

    def ListJobs(self, request: pb.ListJobsRequest, context: grpc.ServicerContext) -> pb.ListJobsResponse:
        self.listed += 1
        return pb.ListJobsResponse(jobs=[pb.Job(id="job-1", name=self.address, state=pb.JOB_STATE_RUNNING)])

    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this fake")

    def WatchEvents(self, request: pb.WatchEventsRequest, context: grpc.ServicerContext) -> Iterator[pb.Event]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this fake")

    def WatchLogs(self, request: pb.WatchLogsRequest, context: grpc.ServicerContext) -> Iterator[pb.LogLine]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this fake")


Start = Callable[[bool], FakeJobs]


@pytest.fixture
def start() -> Iterator[Start]:
    """``start(leads)``: a fake controller on loopback, with the health check the CLI waits for."""
    servers: list[grpc.Server] = []

    def one(leads: bool) -> FakeJobs:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        jobs = FakeJobs(leads)
        rpc.add_JobsServicer_to_server(jobs, server)
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
        jobs.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        server.start()
        servers.append(server)
        return jobs

    yield one
    for server in servers:
        server.stop(None)


def cli(*args: str, controllers: str) -> list[str]:
    skip = ["--skip-model-check"] if args[0] == "submit" else []  # no model built: not this test's subject
    return [*args, "--controller", controllers, "--token", "t", *skip]


def test_a_submit_a_standby_refuses_lands_on_the_leader_it_names_once(
    capsys: pytest.CaptureFixture[str], start: Start
) -> None:
    leader, standby = start(True), start(False)
    standby.leader = leader.address
    assert main(cli("submit", str(EXAMPLE), controllers=standby.address)) == 0
    assert capsys.readouterr().out == "job-1\n"
    assert len(standby.submitted) == 1 and len(leader.submitted) == 1
    assert leader.submitted == standby.submitted and leader.submitted[0]  # the retry is the same submission


def test_a_cancel_goes_to_the_other_listed_controller_when_the_standby_names_none(
    capsys: pytest.CaptureFixture[str], start: Start
) -> None:
    standby, leader = start(False), start(True)
    assert main(cli("cancel", "job-1", controllers=f"{standby.address},{leader.address}")) == 0
    assert capsys.readouterr().out == "job-1 cancelled\n"
    assert standby.cancelled == ["job-1"] and leader.cancelled == ["job-1"]


def test_reads_go_to_the_first_that_answers_even_a_standby(capsys: pytest.CaptureFixture[str], start: Start) -> None:
    standby, leader = start(False), start(True)
    assert main(cli("jobs", "--json", controllers=f"{standby.address},{leader.address}")) == 0
    assert standby.address in capsys.readouterr().out
    assert (standby.listed, leader.listed) == (1, 0)


def test_a_dead_first_address_is_passed_over(capsys: pytest.CaptureFixture[str], start: Start) -> None:
    leader = start(True)
    listed = f"127.0.0.1:{free_port()},{leader.address}"
    assert main(cli("jobs", controllers=listed)) == 0
    assert main(cli("submit", str(EXAMPLE), controllers=listed)) == 0
    assert "job-1" in capsys.readouterr().out
    assert leader.listed == 1 and len(leader.submitted) == 1


def test_when_none_leads_one_line_and_exit_5(capsys: pytest.CaptureFixture[str], start: Start) -> None:
    a, b = start(False), start(False)
    assert main(cli("submit", str(EXAMPLE), controllers=f"{a.address},{b.address}")) == EXIT_UNAVAILABLE
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"spotmorph submit: no controller leads now ({a.address}, {b.address} are standbys); retry in a few seconds\n"
    )
    assert len(a.submitted) == len(b.submitted) == 1 and a.submitted == b.submitted


def test_a_named_leader_that_refuses_too_is_tried_once(capsys: pytest.CaptureFixture[str], start: Start) -> None:
    """Leadership moved between the two calls: each standby names the other; no ping-pong."""
    a, b = start(False), start(False)
    a.leader, b.leader = b.address, a.address
    assert main(cli("cancel", "job-1", controllers=a.address)) == EXIT_UNAVAILABLE
    assert f"({a.address}, {b.address} are standbys)" in capsys.readouterr().err
    assert a.cancelled == b.cancelled == ["job-1"]


def test_a_named_leader_that_does_not_answer_is_named(capsys: pytest.CaptureFixture[str], start: Start) -> None:
    standby = start(False)
    standby.leader = gone = f"127.0.0.1:{free_port()}"
    assert main(cli("cancel", "job-1", controllers=standby.address)) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert f"no controller leads now ({standby.address} is a standby; {gone} does not answer)" in err
    assert err.count("\n") == 1


def test_the_channel_stays_on_the_leader_and_with_call_follows_too(start: Start) -> None:
    leader, standby = start(True), start(False)
    standby.leader = leader.address
    opener = connection.Opener.of("t")
    with LeaderChannel(Route(standby.address, opener(standby.address), [standby.address], opener)) as channel:
        stub = rpc.JobsStub(channel)
        reply: Any
        reply, _ = stub.SubmitJob.with_call(pb.SubmitJobRequest(idempotency_key="k"))
        assert reply.id == "job-1"
        stub.CancelJob(pb.CancelJobRequest(id="job-1"))
        assert stub.ListJobs(pb.ListJobsRequest()).jobs[0].name == leader.address  # reads follow it as well
    assert (standby.submitted, leader.submitted) == (["k"], ["k"])
    assert (standby.cancelled, leader.cancelled) == ([], ["job-1"])  # straight to the leader the second time
