"""The agent's calls against a fake server: retries with backoff on a fake clock, failures by meaning."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from protos.reasons import REASON_KEY, REGISTER_AGAIN
from protos.spotmorph.v1 import controller_pb2 as pb
from worker_agent.agent.gpus import Gpu
from worker_agent.agent.transport import (
    MAX_DETAIL,
    CallRefused,
    ControllerLink,
    ControllerUnreachable,
    Endpoint,
    NodeOffer,
    RegisterAgain,
)
from worker_agent.agent.wire import Registration

OFFER = NodeOffer("", 2, "127.0.0.1", "vm-1")


def failure(code: grpc.StatusCode, details: str = "", reason: str = "") -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata((REASON_KEY, reason)) if reason else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details, None)


class FakeAgentStub:
    """Answers each call with the next scripted outcome (a reply, or an error it raises)."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, Any, Any]] = []

    def __getattr__(self, method: str) -> Any:
        async def call(request: Any, metadata: Any, timeout: float) -> Any:
            self.calls.append((method, request, metadata))
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        return call


class FakeClock:
    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def link(stub: FakeAgentStub, clock: FakeClock | None = None) -> ControllerLink:
    return ControllerLink(Endpoint(("fake:1",)), sleep=(clock or FakeClock()).sleep, stub=stub)


def test_registration_retries_an_unreachable_controller_with_growing_waits() -> None:
    down = failure(grpc.StatusCode.UNAVAILABLE)
    stub = FakeAgentStub(down, down, down, down, pb.RegisterResponse(node_name="node-1", incarnation=1, node_token="n"))
    clock = FakeClock()
    node = asyncio.run(link(stub, clock).register(OFFER, "agent-token", lambda: False, max_backoff=0.5))
    assert node == Registration("node-1", 1, "n", 1.0, 10.0)
    assert clock.slept == [0.2, 0.4, 0.5, 0.5]
    method, request, metadata = stub.calls[-1]
    assert method == "Register" and request.instance_id == "vm-1" and request.slots == 2
    assert metadata == (("authorization", "Bearer agent-token"),)


def test_registration_offers_the_gpus_the_agent_found() -> None:
    h100 = Gpu(0, "NVIDIA H100 80GB HBM3", 85_520_809_984)
    stub = FakeAgentStub(pb.RegisterResponse(node_name="node-1", incarnation=1, node_token="n"))
    offer = NodeOffer("", 2, "127.0.0.1", "vm-1", (h100, Gpu(1, h100.name, h100.memory_bytes)))
    asyncio.run(link(stub).register(offer, "agent-token", lambda: False, max_backoff=0.5))
    sent = stub.calls[-1][1].gpus
    assert [(g.index, g.name, g.memory_bytes) for g in sent] == [
        (0, h100.name, h100.memory_bytes),
        (1, h100.name, h100.memory_bytes),
    ]
    assert not OFFER.gpus  # a CPU node offers none


def test_registration_gives_up_when_the_agent_stops_and_surfaces_a_refusal() -> None:
    stub = FakeAgentStub(failure(grpc.StatusCode.UNAVAILABLE))
    stopping = iter([False, True])
    assert asyncio.run(link(stub).register(OFFER, "t", lambda: next(stopping), max_backoff=1.0)) is None
    refused = FakeAgentStub(failure(grpc.StatusCode.INVALID_ARGUMENT, "slots must be >= 1"))
    with pytest.raises(CallRefused, match="slots must be"):
        asyncio.run(link(refused).register(OFFER, "t", lambda: False, max_backoff=1.0))


def test_a_heartbeat_failure_says_what_it_means_and_a_reply_what_to_run() -> None:
    node = Registration("node-1", 1, "node-token", 1.0, 10.0)
    stub = FakeAgentStub(
        failure(grpc.StatusCode.DEADLINE_EXCEEDED),
        failure(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses;\n last error: " + "x" * 400),
        failure(grpc.StatusCode.FAILED_PRECONDITION, "incarnation 1 is gone; register again", REGISTER_AGAIN),
        failure(grpc.StatusCode.FAILED_PRECONDITION, "job-1 generation 9 was never issued; register again?"),
        pb.HeartbeatResponse(heartbeat_interval_seconds=2.5),
    )
    connection = link(stub)
    with pytest.raises(ControllerUnreachable, match=r"^DEADLINE_EXCEEDED$"):
        asyncio.run(connection.heartbeat(node, [], None))
    with pytest.raises(ControllerUnreachable) as unreachable:  # gRPC's reason, on one bounded line
        asyncio.run(connection.heartbeat(node, [], None))
    assert str(unreachable.value).startswith("UNAVAILABLE: failed to connect to all addresses; last error: xxx")
    assert len(str(unreachable.value)) == len("UNAVAILABLE: ") + MAX_DETAIL and "\n" not in str(unreachable.value)
    with pytest.raises(RegisterAgain, match="register again"):
        asyncio.run(connection.heartbeat(node, [], None))
    with pytest.raises(CallRefused, match="never issued"):  # its words say "register again", its reason does not
        asyncio.run(connection.heartbeat(node, [], None))
    reply = asyncio.run(connection.heartbeat(node, [], None))
    assert reply.heartbeat_interval == 2.5 and reply.incoming.assignment.action == "idle"
    assert stub.calls[-1][2] == (("authorization", "Bearer node-token"),)
