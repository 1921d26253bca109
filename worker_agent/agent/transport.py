"""The agent's side of the ``spotmorph.v1.Agent`` service: one typed async method per RPC.

Each method converts with :mod:`worker_agent.agent.wire` and turns a failed call into what it means
(:class:`ControllerUnreachable`, :class:`RegisterAgain`); only registration retries here, with backoff,
because nothing else can happen before it succeeds. A heartbeat that fails is the loop's business (the
trainers keep training), and a failed report needs no retry (the next heartbeat carries the same facts).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from morphing.errors import UserInputError
from protos.reasons import reason_of
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as pb_grpc
from worker_agent.agent.decisions import (
    FIRST_REGISTER_BACKOFF_SECONDS,
    EvictionNotice,
    Failure,
    UrgentFact,
    classify_failure,
    next_register_backoff,
)
from worker_agent.agent.gpus import Gpu
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.wire import (
    HeartbeatReply,
    Incoming,
    LogChunk,
    Registration,
    gpus_to_pb,
    heartbeat_reply_from_pb,
    heartbeat_to_pb,
    log_chunks_to_pb,
    log_offsets_from_pb,
    registration_from_pb,
    report_reply_from_pb,
    report_to_pb,
)

log = logging.getLogger("spotmorph.agent")

CALL_TIMEOUT_SECONDS = 10
# A restarted controller gives every node one heartbeat expiry (seconds) to be heard from again. gRPC's own
# reconnect backoff grows to 4 s and more while the controller is down, and a call in that backoff fails at
# once without trying: capped at 1 s, the agent reaches the new controller within a heartbeat or two.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


MAX_DETAIL = 240  # characters of gRPC's own words kept in a log line


def unreachable_because(code: str, details: str) -> str:
    """The code and gRPC's reason on one bounded line ("UNAVAILABLE: ... Connection refused"): an operator
    tells a controller that is down from a route, an address or a handshake that fails."""
    detail = " ".join(details.split())
    if len(detail) > MAX_DETAIL:
        detail = detail[: MAX_DETAIL - 3] + "..."
    return f"{code}: {detail}" if detail else code


class CallFailed(Exception):
    """A call to the controller that did not get a reply; ``str()`` says why."""


class ControllerUnreachable(CallFailed):
    """The call may succeed later (the controller restarts, the network heals)."""


class RegisterAgain(CallFailed):
    """The controller no longer accepts this incarnation; only a new registration helps."""


class CallRefused(CallFailed):
    """The controller refused the call for a reason retrying cannot fix: ``detail`` is its word on what."""

    def __init__(self, method: str, code: str, detail: str) -> None:
        super().__init__(f"{method}: {code}: {detail}")
        self.code = code
        self.detail = detail


class RegistrationRefused(CallRefused, UserInputError):
    """The controller will not register this agent (a token it does not accept, a node name another VM
    holds): the operator's to fix, so the agent exits 2 with the reason instead of retrying."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__("Register", code, detail)
        self.args = (f"the controller refused to register this agent: Register: {code}: {detail}",)


@dataclass(frozen=True)
class Endpoint:
    """Where the controller is and how to prove who we are to it."""

    address: str
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True)
class NodeOffer:
    """What a registration offers the controller (an empty name: let the controller choose one)."""

    node_name: str
    slots: int
    address: str
    instance_id: str
    gpus: tuple[Gpu, ...] = ()


class ControllerLink:
    """One channel to the controller, opened on first use."""

    def __init__(
        self, endpoint: Endpoint, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, stub: Any = None
    ) -> None:
        """``sleep`` and ``stub`` are for tests: a fake clock, a fake server."""
        self.endpoint = endpoint
        self.sleep = sleep
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = stub  # grpc-stubs types the stub as synchronous; it is an aio stub

    def _agent_stub(self) -> Any:
        if self._stub is None:
            if self.endpoint.ca:
                creds = grpc.ssl_channel_credentials(
                    self.endpoint.ca.read_bytes(),
                    self.endpoint.key.read_bytes() if self.endpoint.key else None,
                    self.endpoint.cert.read_bytes() if self.endpoint.cert else None,
                )
                self._channel = grpc.aio.secure_channel(self.endpoint.address, creds, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.insecure_channel(self.endpoint.address, options=CHANNEL_OPTIONS)
            self._stub = pb_grpc.AgentStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)

    async def _call(self, method: str, request: Any, token: str) -> Any:
        call = getattr(self._agent_stub(), method)
        try:
            return await call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=CALL_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as exc:
            failure = classify_failure(exc.code().name, reason_of(exc.trailing_metadata()))
            if failure is Failure.RETRY:
                raise ControllerUnreachable(unreachable_because(exc.code().name, exc.details() or "")) from exc
            if failure is Failure.REGISTER_AGAIN:
                raise RegisterAgain(exc.details() or exc.code().name) from exc
            raise CallRefused(method, exc.code().name, exc.details() or "") from exc

    async def register(
        self, offer: NodeOffer, agent_token: str, stopping: Callable[[], bool], max_backoff: float
    ) -> Registration | None:
        """Register, retrying with backoff while the controller is unreachable; None once ``stopping``."""
        backoff = FIRST_REGISTER_BACKOFF_SECONDS
        request = pb.RegisterRequest(
            node_name=offer.node_name,
            slots=offer.slots,
            address=offer.address,
            instance_id=offer.instance_id,
            gpus=gpus_to_pb(offer.gpus),
        )
        while not stopping():
            try:
                return registration_from_pb(await self._call("Register", request, agent_token))
            except ControllerUnreachable as exc:
                log.warning("controller unreachable (%s); retrying in %.1fs", exc, backoff)
                await self.sleep(backoff)
                backoff = next_register_backoff(backoff, max_backoff)
            except RegisterAgain as exc:
                raise RegistrationRefused("REGISTER_AGAIN", str(exc)) from None
            except CallRefused as exc:
                raise RegistrationRefused(exc.code, exc.detail) from None
        return None

    async def heartbeat(
        self,
        node: Registration,
        reports: list[TrainerReport],
        notice: EvictionNotice | None,
        building: str = "",
        wait_seconds: float = 0.0,
    ) -> HeartbeatReply:
        """``building``: the job whose model a warm trainer here is building ahead (:meth:`Supervisor.building`);
        ``wait_seconds``: how long the controller may hold the reply while work may reach the node."""
        request = heartbeat_to_pb(node, reports, notice, building, wait_seconds)
        reply = await self._call("Heartbeat", request, node.node_token)
        return heartbeat_reply_from_pb(reply)

    async def report_event(self, node: Registration, fact: UrgentFact | EvictionNotice) -> Incoming | None:
        """Push one urgent fact; the reply's assignment (None: unchanged)."""
        return report_reply_from_pb(await self._call("ReportEvent", report_to_pb(node, fact), node.node_token))

    async def report_logs(self, node: Registration, chunks: Sequence[LogChunk]) -> list[int]:
        """Send pieces of the trainers' log files; how far the controller has each one's file after."""
        reply = await self._call("ReportLogs", log_chunks_to_pb(node, chunks), node.node_token)
        return log_offsets_from_pb(reply, chunks)
