"""The agent's side of the ``spotmorph.v1.Agent`` service: one typed async method per RPC.

Each method converts with :mod:`worker_agent.agent.wire` and turns a failed call into what it means
(:class:`ControllerUnreachable`, :class:`RegisterAgain`); only registration retries here, with backoff,
because nothing else can happen before it succeeds. A heartbeat that fails is the loop's business (the
trainers keep training), and a failed report needs no retry (the next heartbeat carries the same facts).

Several controllers may be given; calls go to the one that leads as far as the agent knows, and a call that
did not reach a leader moves the next one on (:mod:`worker_agent.agent.addresses`): a standby's refusal that
names the leader is followed there at once, once (a redirect, never a loop); anything else waits for the
loop's cadence. A Register or Heartbeat reply older than the newest leader epoch seen is not acted on at all
(:func:`~worker_agent.agent.decisions.admit_epoch`). The node token is good at every controller: moving on
never registers again.
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
from protos.reasons import leader_of, reason_of
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as pb_grpc
from worker_agent.agent.addresses import MOVE_ON_CODES, Controllers, after_failure
from worker_agent.agent.decisions import (
    FIRST_REGISTER_BACKOFF_SECONDS,
    EpochFence,
    EvictionNotice,
    EvictionRisk,
    Failure,
    UrgentFact,
    admit_epoch,
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
# With several controllers, a call to one that is paused or cut off (it accepts connections but never answers) gives
# up sooner, beyond what a heartbeat may wait for work: the agent must reach the next leader within the heartbeat
# expiry that leader grants every node at its takeover.
SEVERAL_CALL_TIMEOUT_SECONDS = 3
SEVERAL_MAX_WAIT_SECONDS = 1.0  # and a heartbeat's wait for work is kept short, for the same reason
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
MAX_OTHER_CHANNELS = 4  # channels kept open to leaders named outside the configured list


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


class NotLeader(ControllerUnreachable):
    """A standby answered; ``leader``: the leader it named ('' for none), where the next call goes."""

    def __init__(self, address: str, leader: str) -> None:
        named = f"{leader} leads" if leader else "it names no leader"
        super().__init__(f"{address} is not the leader; {named}")
        self.at = address
        self.leader = leader


class StaleEpoch(ControllerUnreachable):
    """A reply older than the newest leader epoch seen: a deposed leader answered, and nothing of it is used."""


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
    """Where the controllers are (any one may lead) and how to prove who we are to them."""

    addresses: tuple[str, ...]
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
    """Channels to the controllers, one per address, each opened on first use."""

    def __init__(
        self, endpoint: Endpoint, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, stub: Any = None
    ) -> None:
        """``sleep`` and ``stub`` are for tests: a fake clock, a fake server (for every address)."""
        self.endpoint = endpoint
        self.sleep = sleep
        self.controllers = Controllers.of(endpoint.addresses)
        self.fence = EpochFence()  # the newest leader epoch seen, for the agent's life
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, Any] = {}  # grpc-stubs types the stub as synchronous; it is an aio stub
        self._stub: Any = stub

    @property
    def address(self) -> str:
        """The controller calls go to now."""
        return self.controllers.current

    async def _agent_stub(self, address: str) -> Any:
        if self._stub is not None:
            return self._stub
        stub = self._stubs.get(address)
        if stub is None:
            self._channels[address] = self._open(address)
            stub = self._stubs[address] = pb_grpc.AgentStub(self._channels[address])
            await self._close_a_named_channel(keep=address)
        return stub

    def _open(self, address: str) -> grpc.aio.Channel:
        if self.endpoint.ca:
            creds = grpc.ssl_channel_credentials(
                self.endpoint.ca.read_bytes(),
                self.endpoint.key.read_bytes() if self.endpoint.key else None,
                self.endpoint.cert.read_bytes() if self.endpoint.cert else None,
            )
            return grpc.aio.secure_channel(address, creds, options=CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)

    async def _close_a_named_channel(self, keep: str) -> None:
        """Keep a bounded number of channels to leaders named outside the list: the oldest goes first."""
        listed = self.controllers.addresses
        named = [a for a in self._channels if a not in listed and a not in (keep, self.address)]
        if len(named) > MAX_OTHER_CHANNELS:
            self._stubs.pop(named[0])
            await self._channels.pop(named[0]).close(None)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)

    async def _call(self, method: str, request: Any, token: str, fenced: bool = False) -> Any:
        """One call to the controller that leads as far as the agent knows. A standby's refusal naming the leader
        is followed there at once, once; ``fenced``: the reply carries the leader's epoch, checked first."""
        try:
            return await self._call_once(method, request, token, fenced)
        except NotLeader as exc:
            if exc.leader in ("", exc.at) or exc.leader != self.address:
                raise  # no leader named (or a concurrent call moved elsewhere): the loop's cadence decides
        return await self._call_once(method, request, token, fenced)

    async def _call_once(self, method: str, request: Any, token: str, fenced: bool) -> Any:
        address = self.address
        call = getattr(await self._agent_stub(address), method)
        try:
            metadata = (("authorization", f"Bearer {token}"),)
            reply = await call(request, metadata=metadata, timeout=self._timeout(request))
        except grpc.aio.AioRpcError as exc:
            raise self._failed(address, method, exc) from exc
        if fenced:
            self._check_epoch(address, method, reply.epoch)
        return reply

    def _timeout(self, request: Any) -> float:
        """How long one call may take: a heartbeat's own wait for work, plus the time to answer."""
        if len(self.controllers.addresses) < 2:
            return CALL_TIMEOUT_SECONDS
        return SEVERAL_CALL_TIMEOUT_SECONDS + float(getattr(request, "wait_seconds", 0.0) or 0.0)

    def _failed(self, address: str, method: str, exc: grpc.aio.AioRpcError) -> CallFailed:
        """What a failed call means, moving the next call on where it did not reach a leader."""
        code, trailing = exc.code().name, exc.trailing_metadata()
        failure = classify_failure(code, reason_of(trailing))
        if failure is Failure.NOT_LEADER:
            leader = leader_of(trailing)
            self._move(address, leader, "said not-leader")
            return NotLeader(address, leader)
        if failure is Failure.RETRY:
            because = unreachable_because(code, exc.details() or "")
            if code in MOVE_ON_CODES:
                self._move(address, "", f"does not answer ({code})")
            return ControllerUnreachable(because)
        if failure is Failure.REGISTER_AGAIN:
            return RegisterAgain(exc.details() or code)
        return CallRefused(method, code, exc.details() or "")

    def _move(self, failed: str, leader: str, why: str) -> None:
        before = self.address
        self.controllers = after_failure(self.controllers, failed, leader)
        if self.address == before:
            return
        if self.address == leader:
            log.warning("controller %s leads now (%s %s)", leader, failed, why)
        else:
            log.warning("controller %s %s; trying %s", failed, why, self.address)

    def _check_epoch(self, address: str, method: str, epoch: int) -> None:
        """Refuse a reply older than the newest epoch seen (logged once per epoch) and look elsewhere."""
        verdict, self.fence = admit_epoch(self.fence, epoch)
        if verdict.act:
            return
        newest = self.fence.newest
        if verdict.say:
            log.warning(
                "refusing %s's %s reply: leader epoch %d is older than epoch %d seen before (a deposed leader); "
                "nothing in it is acted on",
                address,
                method,
                epoch,
                newest,
            )
        self._move(address, "", f"answered with the stale epoch {epoch}")
        raise StaleEpoch(f"{address} answered with leader epoch {epoch}, older than {newest}")

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
                return registration_from_pb(await self._call("Register", request, agent_token, fenced=True))
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
        risk: EvictionRisk | None = None,
    ) -> HeartbeatReply:
        """``building``: the job whose model a warm trainer here is building ahead (:meth:`Supervisor.building`);
        ``wait_seconds``: how long the controller may hold the reply while work may reach the node; ``risk``: the
        cloud's early warning of an eviction, while it stands."""
        if len(self.controllers.addresses) > 1:
            wait_seconds = min(wait_seconds, SEVERAL_MAX_WAIT_SECONDS)
        request = heartbeat_to_pb(node, reports, notice, building, wait_seconds, risk)
        reply = await self._call("Heartbeat", request, node.node_token, fenced=True)
        return heartbeat_reply_from_pb(reply)

    async def report_event(self, node: Registration, fact: UrgentFact | EvictionNotice) -> Incoming | None:
        """Push one urgent fact; the reply's assignment (None: unchanged)."""
        reply = await self._call("ReportEvent", report_to_pb(node, fact), node.node_token, fenced=True)
        return report_reply_from_pb(reply)

    async def report_logs(self, node: Registration, chunks: Sequence[LogChunk]) -> list[int]:
        """Send pieces of the trainers' log files; how far the controller has each one's file after."""
        reply = await self._call("ReportLogs", log_chunks_to_pb(node, chunks), node.node_token)
        return log_offsets_from_pb(reply, chunks)
