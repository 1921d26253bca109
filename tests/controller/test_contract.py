"""gRPC contract tests against a real loopback server: jobs, cluster, agents, fencing, errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.helpers import REPO


def spec(live: Live, **fields: Any) -> pb.JobSpec:
    base: dict[str, Any] = {
        "name": "demo",
        "entrypoint": f"{REPO / 'examples' / 'tiny_gpt.py'}:build",
        "global_batch": 8,
        "steps": 20,
        "checkpoint_dir": str(live.state_dir / "ckpt"),
        "profile": str(live.profile),
    }
    base.update(fields)
    return pb.JobSpec(**base)


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def test_health_needs_no_token(live: Live) -> None:
    stub = health_pb2_grpc.HealthStub(live.channel(None))
    assert stub.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING


def test_submit_runs_on_registered_nodes_and_fences(live: Live) -> None:
    jobs = live.jobs()
    job_id = jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id
    assert jobs.GetJob(pb.GetJobRequest(id=job_id)).state == pb.JOB_STATE_QUEUED
    agent = live.agent(live.agent_token())
    reg = agent.Register(pb.RegisterRequest(slots=2, address="127.0.0.1"))
    assert reg.node_name == "node-1" and reg.incarnation == 1
    node = live.agent(reg.node_token)
    beat = node.Heartbeat(pb.HeartbeatRequest(node_name="node-1", incarnation=1))
    a = beat.assignment
    assert a.job == job_id and a.generation == 1 and a.action == pb.ACTION_RUN and list(a.ranks)
    assert a.rendezvous_endpoint.startswith("127.0.0.1:") and a.checkpoint_dir.endswith("ckpt")
    job = jobs.GetJob(pb.GetJobRequest(id=job_id))
    assert job.state == pb.JOB_STATE_RUNNING and job.generation == 1
    # checkpoint of the current generation is accepted; a stale or future one is fenced off
    commit = pb.CheckpointCommitted(job=job_id, generation=1, step=5)
    node.ReportEvent(pb.ReportEventRequest(node_name="node-1", incarnation=1, checkpoint_committed=commit))
    assert jobs.GetJob(pb.GetJobRequest(id=job_id)).last_checkpoint_step == 5
    stale = pb.CheckpointCommitted(job=job_id, generation=0, step=9)
    request = pb.ReportEventRequest(node_name="node-1", incarnation=1, checkpoint_committed=stale)
    assert code_of(lambda: node.ReportEvent(request)) == grpc.StatusCode.FAILED_PRECONDITION
    future = pb.TrainerStatus(job=job_id, generation=7, rank=0, running=True)
    request2 = pb.HeartbeatRequest(node_name="node-1", incarnation=1, trainers=[future])
    assert code_of(lambda: node.Heartbeat(request2)) == grpc.StatusCode.FAILED_PRECONDITION
    # a second registration of the same name is a new incarnation; the old one is fenced off
    again = agent.Register(pb.RegisterRequest(node_name="node-1", slots=2, address="127.0.0.1"))
    assert again.incarnation == 2
    old = pb.HeartbeatRequest(node_name="node-1", incarnation=1)
    assert code_of(lambda: node.Heartbeat(old)) == grpc.StatusCode.FAILED_PRECONDITION
    # another node's token may not act as node-1
    another_vm = live.agent(live.agent_token("vm-other"))
    other = live.agent(another_vm.Register(pb.RegisterRequest(slots=1, address="127.0.0.1")).node_token)
    assert code_of(lambda: other.Heartbeat(old)) == grpc.StatusCode.PERMISSION_DENIED
    events = list(jobs.WatchEvents(pb.WatchEventsRequest(job=job_id)))
    assert events[0].kind == "JobSubmitted" and any(e.kind == "GenerationIssued" for e in events)
    # every event names the decision that wrote it, and a decision's events can be asked for alone
    assert all(e.decision > 0 for e in events)
    issued = next(e for e in events if e.kind == "GenerationIssued")
    together = list(jobs.WatchEvents(pb.WatchEventsRequest(decision=issued.decision)))
    assert issued.seq in {e.seq for e in together} and {e.decision for e in together} == {issued.decision}
    assert any(e.kind == "NodeStateChanged" for e in together), "the nodes it placed ranks on, in the same decision"
    assert not list(jobs.WatchEvents(pb.WatchEventsRequest(decision=10**9)))


def test_bad_input_statuses(live: Live, tmp_path: Path) -> None:
    jobs = live.jobs()
    missing = spec(live, entrypoint=str(tmp_path / "nope.py") + ":build")
    with pytest.raises(grpc.RpcError) as info:
        jobs.SubmitJob(pb.SubmitJobRequest(spec=missing))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "entrypoint" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live, dtype="int8")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "dtype" in (info.value.details() or "")
    for bad_deadline, words in [
        ({"deadline": "2027-01-01T00:00:00"}, "no time zone"),
        ({"deadline": "2021-01-01T00:00:00Z"}, "passed"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live, **bad_deadline)))
        details = info.value.details() or ""
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "deadline" in details and words in details
    assert code_of(lambda: jobs.GetJob(pb.GetJobRequest(id="job-999"))) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: jobs.CancelJob(pb.CancelJobRequest(id="job-999"))) == grpc.StatusCode.NOT_FOUND
    huge = spec(live, name="x" * (2 << 20))
    assert code_of(lambda: jobs.SubmitJob(pb.SubmitJobRequest(spec=huge))) == grpc.StatusCode.RESOURCE_EXHAUSTED
    job_id = jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id
    assert jobs.CancelJob(pb.CancelJobRequest(id=job_id)).state == pb.JOB_STATE_CANCELLED
    again = pb.CancelJobRequest(id=job_id)
    assert code_of(lambda: jobs.CancelJob(again)) == grpc.StatusCode.FAILED_PRECONDITION
    agent = live.agent(live.agent_token())
    bad = pb.RegisterRequest(slots=0, address="127.0.0.1")
    assert code_of(lambda: agent.Register(bad)) == grpc.StatusCode.INVALID_ARGUMENT
