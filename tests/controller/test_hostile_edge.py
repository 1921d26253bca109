"""Issue 12, one test per finding: every field from outside is hostile, and none stops the controller deciding."""

from __future__ import annotations

import itertools
import math
import sqlite3
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from morphing.profile import parse_profile
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.conftest import Live
from tests.controller.test_contract import code_of, spec

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details() or ""


def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.02)


def node_state(live: Live, name: str) -> int:
    nodes = live.cluster().ListNodes(pb.ListNodesRequest()).nodes
    return next(n.state for n in nodes if n.name == name)


VMS = itertools.count(1)


class Node:
    """A registered node speaking raw requests with its own token, on a VM of its own unless told."""

    def __init__(self, live: Live, name: str = "", address: str = "127.0.0.1", instance: str = "", slots: int = 2):
        request = pb.RegisterRequest(node_name=name, slots=slots, address=address, instance_id=instance)
        self.vm = instance or f"vm-test-{next(VMS)}"  # a per-VM token's VM is one live node
        reply = live.agent(live.agent_token(self.vm)).Register(request)
        self.name, self.incarnation = reply.node_name, reply.incarnation
        self.stub: rpc.AgentStub = live.agent(reply.node_token)

    def beat(self, *trainers: pb.TrainerStatus, **fields: Any) -> pb.HeartbeatResponse:
        request = pb.HeartbeatRequest(node_name=self.name, incarnation=self.incarnation, trainers=trainers, **fields)
        return self.stub.Heartbeat(request, timeout=10)

    def report(self, **event: Any) -> pb.ReportEventResponse:
        request = pb.ReportEventRequest(node_name=self.name, incarnation=self.incarnation, **event)
        return self.stub.ReportEvent(request, timeout=10)


def running_job(live: Live, **fields: Any) -> tuple[Node, str, int]:
    """A job of 20 steps (unless ``steps`` says otherwise) running on one new node."""
    job_id = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live, **fields))).id
    node = Node(live)
    assignment = node.beat().assignment
    assert assignment.job == job_id
    return node, job_id, assignment.generation


def healthy(live: Live) -> int:
    stub = health_pb2_grpc.HealthStub(live.channel(None))
    return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status)


def test_an_out_of_range_heartbeat_is_refused_and_decisions_go_on(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100_000)
    huge = pb.TrainerStatus(
        job=job_id, generation=generation, rank=0, running=True, last_step=5, last_checkpoint_step=2**63
    )
    code, detail = refusal(lambda: node.beat(huge))
    assert code == INVALID and "last_checkpoint_step" in detail
    past = pb.TrainerStatus(job=job_id, generation=generation, rank=0, running=True, last_step=10**15)
    code, detail = refusal(lambda: node.beat(past))
    assert code == INVALID and "last_step" in detail and "100000" in detail
    commit = pb.CheckpointCommitted(job=job_id, generation=generation, step=2**63)
    code, detail = refusal(lambda: node.report(checkpoint_committed=commit))
    assert code == INVALID and "checkpoint_committed.step" in detail
    assert live.jobs().GetJob(pb.GetJobRequest(id=job_id)).step == 0
    other = Node(live)
    other.beat()
    assert node_state(live, other.name) == pb.NODE_STATE_READY
    second = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live, checkpoint_dir=str(live.state_dir / "c2"))))
    assert second.id and healthy(live) == health_pb2.HealthCheckResponse.SERVING


def test_nul_bytes_in_an_address_or_a_checkpoint_dir_are_refused(live: Live) -> None:
    agent = live.agent(live.agent_token())
    code, detail = refusal(lambda: agent.Register(pb.RegisterRequest(slots=1, address="127.0.0.1\x00")))
    assert code == INVALID and detail.startswith("address:")
    bad = spec(live, checkpoint_dir=str(live.state_dir / "ck\x00pt"))
    code, detail = refusal(lambda: live.jobs().SubmitJob(pb.SubmitJobRequest(spec=bad)))
    assert code == INVALID and "checkpoint_dir" in detail and "control characters" in detail
    assert not live.jobs().ListJobs(pb.ListJobsRequest()).jobs


def test_a_live_node_cannot_be_taken_over_but_its_own_instance_may_register_again(live: Live) -> None:
    victim = Node(live, "victim", address="10.0.0.1", instance="vm-7")
    victim.beat()
    agent = live.agent(live.agent_token())
    thief = pb.RegisterRequest(node_name="victim", slots=1024, address="10.0.0.2")
    code, detail = refusal(lambda: agent.Register(thief))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "wait until it is LOST" in detail
    assert node_state(live, "victim") == pb.NODE_STATE_READY
    other_vm = live.agent(live.agent_token("vm-8"))
    same_address = pb.RegisterRequest(node_name="victim", slots=2, address="10.0.0.1", instance_id="vm-8")
    assert code_of(lambda: other_vm.Register(same_address)) == grpc.StatusCode.PERMISSION_DENIED
    restarted = Node(live, "victim", address="10.0.0.1", instance="vm-7")  # an agent restart on the same VM
    assert restarted.incarnation == 2
    assert code_of(victim.beat) == grpc.StatusCode.FAILED_PRECONDITION


def test_a_requested_name_that_looks_generated_breaks_no_later_generated_name(live: Live) -> None:
    long = "node-" + "9" * 58
    assert Node(live, long).name == long
    assert Node(live, "node-2").name == "node-2"
    assert [Node(live).name for _ in range(3)] == ["node-1", "node-3", "node-4"]


def test_low_severity_fields(live: Live) -> None:
    jobs, agent = live.jobs(), live.agent(live.agent_token())
    code, detail = refusal(lambda: list(jobs.WatchEvents(pb.WatchEventsRequest(after_seq=2**63), timeout=5)))
    assert code == INVALID and "after_seq" in detail
    assert list(jobs.WatchEvents(pb.WatchEventsRequest(after_seq=2**63 - 1), timeout=5)) == []
    code, detail = refusal(lambda: agent.Register(pb.RegisterRequest(node_name="abc\n", slots=1, address="h")))
    assert code == INVALID and detail.startswith("node_name:")
    node = Node(live)
    node.beat()
    for value in (math.nan, math.inf, -1.0):
        notice = pb.EvictionNotice(not_before=value)
        code, detail = refusal(partial(node.beat, eviction=notice))
        assert code == INVALID and detail.startswith("eviction.not_before:") and "not a time" in detail
        assert code_of(partial(node.report, eviction=notice)) == INVALID
    assert node_state(live, node.name) == pb.NODE_STATE_READY


def test_reports_for_unknown_jobs_are_refused_and_kept_nowhere(live: Live) -> None:
    node = Node(live)
    node.beat()
    runner = live.controller.runner
    before, decided = runner.observed[node.name], runner.reconciles
    ghost = pb.TrainerStatus(job="job-999", generation=1, rank=0, running=False, exit_code=1)
    for i in range(300):
        ghost.rank = i
        assert code_of(lambda: node.report(trainer_exited=pb.TrainerExited(trainer=ghost))) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: node.beat(ghost)) == grpc.StatusCode.NOT_FOUND
    assert runner.observed[node.name] is before
    assert runner.reconciles - decided < 20, "no decision pass per refused report (only the 1 s ticks)"


def test_relative_paths_in_a_raw_submission_are_refused(live: Live) -> None:
    jobs = live.jobs()
    for field, value in [
        ("checkpoint_dir", "ckpt"),
        ("profile", "profile.json"),
        ("entrypoint", "examples/tiny_gpt.py:build"),
        ("checkpoint_dir", str(live.state_dir / ".." / "ckpt")),
    ]:
        code, detail = refusal(partial(jobs.SubmitJob, pb.SubmitJobRequest(spec=spec(live, **{field: value}))))
        assert code == INVALID and detail.startswith(f"{field}:"), detail


def test_a_profile_must_be_a_small_regular_file_holding_a_profile(live: Live, tmp_path: Path) -> None:
    jobs = live.jobs()
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (17 << 20))
    for path, words in [
        ("/etc/passwd", "is not valid JSON"),
        ("/dev/zero", "is not a regular file"),
        (str(big), "more than a profile's"),
        (str(tmp_path / "missing.json"), "does not exist"),
    ]:
        code, detail = refusal(partial(jobs.SubmitJob, pb.SubmitJobRequest(spec=spec(live, profile=path))))
        assert code == INVALID and detail.startswith("profile") and words in detail, detail
    (tmp_path / "folder.py").mkdir()
    for entrypoint, words in [(f"{tmp_path}/folder.py:build", "not a regular file"), (f"{tmp_path}:build", ".py")]:
        code, detail = refusal(partial(jobs.SubmitJob, pb.SubmitJobRequest(spec=spec(live, entrypoint=entrypoint))))
        assert code == INVALID and detail.startswith("entrypoint:") and words in detail, detail
    assert not jobs.ListJobs(pb.ListJobsRequest()).jobs


def test_a_profile_of_other_layers_than_the_clients_model_is_refused_at_submit(live: Live) -> None:
    """`spotmorph submit` names the model's layers (built on the meta device); the controller checks the
    profile it will plan with against them, and the names themselves as hostile input."""
    jobs = live.jobs()
    names = [layer.name for layer in parse_profile(live.profile.read_text()).layers]
    assert len(names) >= 3
    for layers, words in [
        (names[:-1], f"the profile has {len(names)} layers, the model {len(names) - 1} (the first"),
        ([names[0], "other", *names[2:]], f"layer 1 is {names[1]!r} in the profile, 'other' in the model"),
        ([*names, "extra"], f"the profile has {len(names)} layers, the model {len(names) + 1}"),
    ]:
        request = pb.SubmitJobRequest(spec=spec(live), model_layers=layers)
        code, detail = refusal(partial(jobs.SubmitJob, request))
        assert code == INVALID and detail.startswith("profile: ") and words in detail, detail
        assert "`spotmorph profile ENTRYPOINT`" in detail and "\n" not in detail, detail
    for layers, field in [
        (["a\x00b"], "model_layers[0]: "),
        ([names[0], ""], "model_layers[1]: empty"),
        (["x" * 201], "model_layers[0]: 201 characters"),
        (["a"] * 100_001, "model_layers: 100001 names"),
    ]:
        code, detail = refusal(partial(jobs.SubmitJob, pb.SubmitJobRequest(spec=spec(live), model_layers=layers)))
        assert code == INVALID and detail.startswith(field), detail
    assert not jobs.ListJobs(pb.ListJobsRequest()).jobs
    assert jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live), model_layers=names)).id


def test_a_checkpoint_dir_another_job_uses_or_used_is_refused_at_submit(live: Live) -> None:
    """Running, or ended: its checkpoints are there (issue 44), and this job's pruning would delete them."""
    jobs = live.jobs()
    first = jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id
    code, detail = refusal(lambda: jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live, name="second"))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and first in detail and "checkpoint_dir" in detail
    jobs.CancelJob(pb.CancelJobRequest(id=first))
    code, detail = refusal(lambda: jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live, name="second"))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"holds the checkpoints of {first} (CANCELLED)" in detail
    assert "give this job its own directory" in detail and "\n" not in detail
    # A directory another controller's job wrote to: its fence names that job.
    elsewhere = live.state_dir / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".fence").write_text('{"job": "job-41", "generation": 3}')
    code, detail = refusal(lambda: jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live, checkpoint_dir=str(elsewhere)))))
    assert code == INVALID and detail.startswith("checkpoint_dir: ") and "checkpoints of job 'job-41'" in detail, detail
    fresh = str(live.state_dir / "fresh")
    retried = pb.SubmitJobRequest(spec=spec(live, checkpoint_dir=fresh), idempotency_key="k-fence")
    made = jobs.SubmitJob(retried).id
    Path(fresh).mkdir()
    (Path(fresh) / ".fence").write_text(f'{{"job": "{made}", "generation": 1}}')  # its trainers began
    assert jobs.SubmitJob(retried).id == made  # a retry gets its job, not a refusal of its own directory


def test_a_retried_submission_returns_the_first_job(live: Live) -> None:
    jobs = live.jobs()
    request = pb.SubmitJobRequest(spec=spec(live), idempotency_key="3f1c2b1e-retry")
    first = jobs.SubmitJob(request).id
    assert jobs.SubmitJob(request).id == first
    other = pb.SubmitJobRequest(spec=spec(live, steps=21), idempotency_key="3f1c2b1e-retry")
    code, detail = refusal(lambda: jobs.SubmitJob(other))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "idempotency_key" in detail and first in detail
    assert [j.id for j in jobs.ListJobs(pb.ListJobsRequest()).jobs] == [first]
    long_key = pb.SubmitJobRequest(spec=spec(live), idempotency_key="k" * 129)
    assert code_of(lambda: jobs.SubmitJob(long_key)) == INVALID


def test_health_is_not_serving_while_decisions_fail_and_serving_once_they_work(live: Live) -> None:
    store = live.controller.store
    persist = store.persist

    def full(commands: Any, stimulus: Any = None) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    store.persist = full  # type: ignore[method-assign]
    try:
        code, detail = refusal(lambda: live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live))))
        assert code == grpc.StatusCode.UNAVAILABLE and "retry" in detail
        wait_for(lambda: healthy(live) == health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING")
        assert not live.jobs().ListJobs(pb.ListJobsRequest()).jobs, "a failed SubmitJob leaves no job behind"
    finally:
        store.persist = persist  # type: ignore[method-assign]
    wait_for(lambda: healthy(live) == health_pb2.HealthCheckResponse.SERVING, "SERVING again (the next tick)")
    assert live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id == "job-1"


def test_a_withdrawn_notice_returns_the_node_to_its_live_state(live: Live) -> None:
    node, _, _ = running_job(live)
    node.beat(eviction=pb.EvictionNotice(not_before=time.time() + 30, source="imds"))
    assert node_state(live, node.name) == pb.NODE_STATE_DRAINING
    node.beat()
    assert node_state(live, node.name) == pb.NODE_STATE_ASSIGNED
    kinds = [e.kind for e in live.jobs().WatchEvents(pb.WatchEventsRequest(), timeout=5)]
    assert "EvictionWithdrawn" in kinds


def test_a_node_speaks_only_for_the_ranks_placed_on_it(live: Live) -> None:
    nodes = [Node(live, slots=1), Node(live, slots=1)]
    for node in nodes:
        node.beat()
    job_id = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live, min_gpus=2))).id
    first, second = (node.beat().assignment for node in nodes)
    assert first.job == second.job == job_id and list(first.ranks) != list(second.ranks)
    theirs = pb.TrainerStatus(job=job_id, generation=first.generation, rank=second.ranks[0], running=True)
    code, detail = refusal(lambda: nodes[0].beat(theirs))
    assert code == INVALID and "rank" in detail and nodes[0].name in detail
    mine = pb.TrainerStatus(job=job_id, generation=first.generation, rank=first.ranks[0], running=True)
    assert nodes[0].beat(mine).assignment.job == job_id


def test_a_node_outside_the_job_cannot_commit_its_checkpoint(live: Live) -> None:
    """Only a node the current generation runs on may move the step the next generation resumes from."""
    node, job_id, generation = running_job(live, steps=100)
    outsider = Node(live)
    outsider.beat()
    commit = pb.CheckpointCommitted(job=job_id, generation=generation, step=5, path="/x")
    code, detail = refusal(lambda: outsider.report(checkpoint_committed=commit))
    assert code == INVALID and "runs no rank" in detail
    assert live.jobs().GetJob(pb.GetJobRequest(id=job_id)).last_checkpoint_step == 0
    node.report(checkpoint_committed=commit)
    assert live.jobs().GetJob(pb.GetJobRequest(id=job_id)).last_checkpoint_step == 5
