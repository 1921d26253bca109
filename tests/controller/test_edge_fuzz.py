"""Every RPC and every field of it, fuzzed against a running controller (hypothesis).

Values are drawn per field type from the contract's descriptors, hostile ones favoured: integers at and
past what SQLite stores, NaN and infinities, control characters, overlong strings, paths to devices
and system files. Node calls carry a registered node's name and incarnation (and trainers a real job's
id and generation) most of the time, so the fuzz gets past the fences to the checks behind them. No
call may end UNKNOWN or INTERNAL (an unexpected exception), UNAVAILABLE (decisions failing) or
DEADLINE_EXCEEDED (a hang); afterwards the controller still decides: a silent node is LOST once its
expiry passed on the controller's clock, and a submission still works.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.conftest import Live
from tests.controller.test_contract import spec

F = FieldDescriptor
EDGES = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
HOSTILE_TEXT = [
    "",
    "\x00",
    "abc\n",
    "a\x00b",
    "node-" + "9" * 58,
    "node-" + "9" * 80,
    "x" * 5000,
    "../../etc",
    "/etc/passwd",
    "/dev/zero",
    "/proc/self/mem",
    "relative/path.py:build",
    "job-1",
    "127.0.0.1",
    "::",
    "\u202eevil",
]
FAILURES = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


def unsigned(bits: int) -> st.SearchStrategy[int]:
    top = 2**bits - 1
    return st.one_of(
        st.integers(0, 30),
        st.sampled_from([e for e in EDGES if e <= top]),
        st.integers(0, top),
        st.integers(top // 2, top),
    )


def signed(bits: int) -> st.SearchStrategy[int]:
    return st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


TEXT = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=64), st.text(st.characters(max_codepoint=31)))
SCALARS: dict[int, st.SearchStrategy[Any]] = {
    F.TYPE_UINT64: unsigned(64),
    F.TYPE_UINT32: unsigned(32),
    F.TYPE_INT64: signed(64),
    F.TYPE_INT32: signed(32),
    F.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    F.TYPE_BOOL: st.booleans(),
    F.TYPE_STRING: TEXT,
    F.TYPE_BYTES: st.one_of(st.binary(max_size=64), st.sampled_from([b"line\n", b"\xff\xfe\r\n", b"y" * 20_000])),
    F.TYPE_ENUM: st.integers(0, 7),
}
Anchors = dict[str, st.SearchStrategy[dict[str, Any]]]


def message(descriptor: Descriptor, anchors: Anchors, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type with any subset of fields set to any value of their type.

    ``anchors``: per message type, real values for some of its fields (a registered node's name and
    incarnation, a running job's id and generation), laid over most messages of that type so that
    fuzzed calls get past the fences to the checks behind them.
    """
    cls = getattr(pb, descriptor.name)

    def value(field: FieldDescriptor) -> st.SearchStrategy[Any]:
        if field.type == F.TYPE_MESSAGE:
            assert field.message_type is not None
            one: st.SearchStrategy[Any] = message(field.message_type, anchors, depth + 1)
        else:
            one = SCALARS[field.type]
        return st.lists(one, min_size=1, max_size=3) if field.is_repeated else one

    fields = {f.name: value(f) for f in descriptor.fields if f.type != F.TYPE_MESSAGE or depth < 2}
    base = st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))
    patch = anchors.get(descriptor.name)
    if patch is None:
        return base

    def anchored(drawn: tuple[Message, int, dict[str, Any]]) -> Message:
        built, odds, values = drawn
        for name, real in values.items() if odds < 4 else ():
            setattr(built, name, real)
        return built

    return st.tuples(base, st.integers(0, 4), patch).map(anchored)


METHODS = {
    f"{service.name}/{method.name}": method
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}
WEIGHTED = sorted(METHODS) + ["Agent/Heartbeat", "Agent/ReportEvent", "Agent/Register", "Jobs/SubmitJob"] * 2
NODE_CALLS = {"Agent/Heartbeat", "Agent/ReportEvent", "Agent/ReportLogs"}
STREAMS = {"Jobs/WatchEvents", "Jobs/WatchLogs"}


class Target:
    """The running controller with a registered node running a job, and a stub for every role."""

    def __init__(self, live: Live) -> None:
        self.live = live
        self.stubs: dict[str, Any] = {
            "Jobs": rpc.JobsStub(live.channel(live.token("operator"))),
            "Cluster": rpc.ClusterStub(live.channel(live.token("reader"))),
            "Agent": rpc.AgentStub(live.channel(live.agent_token())),
            "Identity": rpc.IdentityStub(live.channel(None)),  # open: its request is the credential
        }
        self.valid_spec = spec(live)
        self.job, self.generation, self.incarnation = "", 0, 0
        self.waiting, self.made = "", 0  # the newest job made to run on the anchor, how many were made
        self.register()
        self.refresh()

    def register(self) -> None:
        """(Re-)register the anchor node: the same instance, so a new incarnation is allowed."""
        request = pb.RegisterRequest(node_name="anchor", slots=2, address="127.0.0.1", instance_id="anchor-vm")
        reply = self.live.agent(self.live.agent_token("anchor-vm")).Register(request, timeout=10)
        self.node = rpc.AgentStub(self.live.channel(reply.node_token))
        self.incarnation = reply.incarnation

    def beat(self) -> pb.Assignment:
        request = pb.HeartbeatRequest(node_name="anchor", incarnation=self.incarnation)
        return self.node.Heartbeat(request, timeout=10).assignment

    def refresh(self) -> None:
        """Keep a job running on the anchor node (the fuzz cancels, fails and finishes jobs, drains nodes)."""
        assignment = self.beat()
        jobs = self.stubs["Jobs"]
        if not assignment.job:
            if not self.waiting or jobs.GetJob(pb.GetJobRequest(id=self.waiting)).state != pb.JOB_STATE_QUEUED:
                self.made += 1
                anchor = spec(self.live, checkpoint_dir=f"/tmp/fuzz-anchor-{self.made}", priority=1000)
                self.waiting = jobs.SubmitJob(pb.SubmitJobRequest(spec=anchor), timeout=10).id
            assignment = self.beat()
        if not assignment.job:  # held back (draining, say): a new incarnation of the same instance
            self.register()
            assignment = self.beat()
        self.job, self.generation = assignment.job, assignment.generation

    def anchors(self) -> Anchors:
        """Real values for the fields the fences check first, drawn when an example is."""
        node = st.builds(lambda: {"node_name": "anchor", "incarnation": self.incarnation})
        job = st.builds(lambda: {"job": self.job, "generation": self.generation})
        return {
            "HeartbeatRequest": node,
            "ReportEventRequest": node,
            "ReportLogsRequest": node,
            "LogChunk": st.tuples(job, st.integers(0, 2)).map(lambda t: {**t[0], "rank": t[1]}),
            "WatchLogsRequest": st.builds(lambda: {"job": self.job}),
            "TrainerStatus": st.tuples(job, st.integers(0, 2)).map(lambda t: {**t[0], "rank": t[1]}),
            "CheckpointCommitted": job,
            "RegisterRequest": st.builds(lambda slots: {"slots": slots, "address": "10.0.0.9"}, st.integers(1, 4)),
            "GetJobRequest": st.builds(lambda: {"id": self.job}),
            "CancelJobRequest": st.just({"id": "job-1"}),
            "EvictionNotice": st.builds(lambda t: {"not_before": t}, st.floats(1e9, 3e9)),
        }

    def ready(self, request: Message, whole_spec: bool) -> Message:
        """A random SubmitJob's fields laid over a valid spec (mostly); WatchEvents and WatchLogs never follow."""
        if isinstance(request, pb.SubmitJobRequest) and whole_spec:
            mutated = pb.JobSpec()
            mutated.CopyFrom(self.valid_spec)
            mutated.MergeFrom(request.spec)
            request.spec.CopyFrom(mutated)
        if isinstance(request, pb.WatchEventsRequest | pb.WatchLogsRequest):
            request.follow = False
        return request

    def call(self, method: str, request: Message) -> grpc.StatusCode:
        service, name = method.split("/")
        stub = self.node if method in NODE_CALLS else self.stubs[service]
        rpc_call: Callable[..., Any] = getattr(stub, name)
        try:
            reply = rpc_call(request, timeout=10)
            if method in STREAMS:
                list(reply)
        except grpc.RpcError as exc:
            assert exc.code() not in FAILURES, (method, exc.code(), exc.details(), request)
            return exc.code()
        return grpc.StatusCode.OK


@pytest.mark.slow
def test_fuzzing_every_rpc_and_field_never_surprises_the_controller_and_it_still_decides(live_clock: Live) -> None:
    live = live_clock
    target = Target(live)
    anchors = target.anchors()
    requests = {name: message(method.input_type, anchors) for name, method in METHODS.items()}
    seen: dict[str, set[grpc.StatusCode]] = {}

    @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.sampled_from(WEIGHTED).flatmap(lambda m: st.tuples(st.just(m), requests[m], st.booleans())))
    def fuzz(call: tuple[str, Message, bool]) -> None:
        method, request, whole_spec = call
        seen.setdefault(method, set()).add(target.call(method, target.ready(request, whole_spec)))
        target.refresh()  # before the next example is drawn with the anchor's values

    fuzz()
    assert set(seen) == set(METHODS), "every RPC was called"
    assert len(set().union(*seen.values())) >= 4, seen
    health = health_pb2_grpc.HealthStub(live.channel(None))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    still_decides(live)


def still_decides(live: Live) -> None:
    """A node that goes silent is LOST once its expiry passed, and a submission works."""
    assert live.clock is not None
    agent = live.agent(live.agent_token("vm-after-fuzz"))  # a VM of its own: the fuzzer's holds its nodes
    reply = agent.Register(pb.RegisterRequest(node_name="after-fuzz", slots=1, address="127.0.0.1"))
    rpc.AgentStub(live.channel(reply.node_token)).Heartbeat(
        pb.HeartbeatRequest(node_name="after-fuzz", incarnation=reply.incarnation)
    )
    cluster = live.cluster()

    def state() -> int:
        return next(n.state for n in cluster.ListNodes(pb.ListNodesRequest()).nodes if n.name == "after-fuzz")

    assert state() in {pb.NODE_STATE_READY, pb.NODE_STATE_ASSIGNED}  # a job the fuzz queued may take it
    live.clock.at += live.controller.settings.heartbeat_expiry_seconds + 1
    deadline = time.monotonic() + 10  # the next 1 s tick decides it
    while state() != pb.NODE_STATE_LOST:
        assert time.monotonic() < deadline, "a silent node was never declared LOST after the fuzzing"
        time.sleep(0.05)
    submitted = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live, checkpoint_dir="/tmp/after-fuzz")))
    assert live.jobs().GetJob(pb.GetJobRequest(id=submitted.id)).state in {pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING}
