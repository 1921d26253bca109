"""Each role x each RPC against a real server; random messages never crash it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.api.auth import OPEN_SERVICES, POLICY, Role, read_or_create_token
from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.cli import build_parser
from tests.controller.conftest import Live

REQUESTS: dict[str, Any] = {
    "/spotmorph.v1.Jobs/SubmitJob": pb.SubmitJobRequest(),
    "/spotmorph.v1.Jobs/CancelJob": pb.CancelJobRequest(id="nope"),
    "/spotmorph.v1.Jobs/GetJob": pb.GetJobRequest(id="nope"),
    "/spotmorph.v1.Jobs/ListJobs": pb.ListJobsRequest(),
    "/spotmorph.v1.Jobs/WatchEvents": pb.WatchEventsRequest(),
    "/spotmorph.v1.Jobs/WatchLogs": pb.WatchLogsRequest(job="nope"),
    "/spotmorph.v1.Cluster/ListNodes": pb.ListNodesRequest(),
    "/spotmorph.v1.Cluster/GetClusterState": pb.GetClusterStateRequest(),
    "/spotmorph.v1.Agent/Register": pb.RegisterRequest(slots=0),
    "/spotmorph.v1.Agent/Heartbeat": pb.HeartbeatRequest(node_name="node-x", incarnation=1),
    "/spotmorph.v1.Agent/ReportEvent": pb.ReportEventRequest(node_name="node-x", incarnation=1),
    "/spotmorph.v1.Agent/ReportLogs": pb.ReportLogsRequest(node_name="node-x", incarnation=1),
}
STREAMING = {"/spotmorph.v1.Jobs/WatchEvents", "/spotmorph.v1.Jobs/WatchLogs"}


def _call(live: Live, token: str | None, method: str, request: Any) -> grpc.StatusCode:
    channel = live.channel(token)
    serialize = type(request).SerializeToString
    try:
        if method in STREAMING:
            list(channel.unary_stream(method, serialize, None)(request, timeout=5))
        else:
            channel.unary_unary(method, serialize, None)(request, timeout=5)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_policy_covers_every_method() -> None:
    methods = {f"/spotmorph.v1.{s.name}/{m.name}" for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}
    open_methods = {m for m in methods if m.startswith(OPEN_SERVICES)}  # Identity: its request is the credential
    assert open_methods == {"/spotmorph.v1.Identity/ExchangeIdentity"}
    assert methods - open_methods == set(POLICY) == set(REQUESTS)


def test_auth_matrix(live: Live) -> None:
    node_token = live.controller.tokens.node_token("node-x", 1)
    tokens = {
        Role.OPERATOR: live.token("operator"),
        Role.READER: live.token("reader"),
        Role.AGENT: live.agent_token(),
        Role.NODE: node_token,
    }
    denied = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
    for method, request in REQUESTS.items():
        assert _call(live, None, method, request) == grpc.StatusCode.UNAUTHENTICATED, method
        assert _call(live, "forged", method, request) == grpc.StatusCode.UNAUTHENTICATED, method
        for role, token in tokens.items():
            code = _call(live, token, method, request)
            if role in POLICY[method]:
                assert code not in denied, (method, role, code)
            else:
                assert code == grpc.StatusCode.PERMISSION_DENIED, (method, role, code)
    health = health_pb2_grpc.HealthStub(live.channel(None))
    assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(sorted(REQUESTS)), payload=st.binary(max_size=256))
def test_random_bytes_never_crash_the_server(live: Live, method: str, payload: bytes) -> None:
    role = sorted(POLICY[method])[0]
    tokens = {Role.NODE: live.controller.tokens.node_token("node-x", 1), Role.AGENT: live.agent_token()}
    token = tokens.get(role) or live.token(str(role))
    channel = live.channel(token)
    try:
        if method in STREAMING:
            list(channel.unary_stream(method, None, None)(payload, timeout=5))
        else:
            channel.unary_unary(method, None, None)(payload, timeout=5)
    except grpc.RpcError as exc:
        # corrupt wire bytes are refused by grpc's decoder (INTERNAL); decodable ones must not surprise us
        if "Wire format" not in (exc.details() or "") and "parsing" not in (exc.details() or "").lower():
            assert exc.code() not in {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}, exc.details()
    health = health_pb2_grpc.HealthStub(live.channel(None))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING


def test_new_tokens_are_private_and_pass_as_a_separate_command_line_value(tmp_path: Path) -> None:
    """A token is pasted after ``--token``; one starting with ``-`` would be taken for an option."""
    parser, _ = build_parser()
    for i in range(512):  # about one random token in 64 would start with "-"
        path = tmp_path / f"{i}.token"
        token = read_or_create_token(path)
        assert path.stat().st_mode & 0o777 == 0o600
        assert read_or_create_token(path) == token
        args = parser.parse_args(["jobs", "--token", token])
        assert args.token == token
