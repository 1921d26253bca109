"""Writes follow the leader: a standby controller answers reads but refuses writes (FAILED_PRECONDITION, reason
``not-leader``, naming the leader it knows), so a refused call is sent again, once, where it can be done.

It lives in one channel wrapper, not in each command: every unary call made through :class:`LeaderChannel`
that a standby refuses goes to the leader it names, else to the other listed controllers, with the same
request object, so a submission's idempotency key is the same on every try and no second job is made. A
refusal executed nothing, so sending the call again is safe for any write. When every controller tried
stands by, :class:`NoLeader` says so in one line. Streams (reads) are never refused and pass straight through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc

from controller.client import connection
from protos.reasons import NOT_LEADER, leader_of, reason_of

T = TypeVar("T")
Invoke = Callable[[grpc.Channel], T]


class NoLeader(Exception):
    """No controller tried would take a write (all stand by, or do not answer); ``str()`` is the one line."""


def refused_by_standby(exc: grpc.RpcError) -> bool:
    """Whether ``exc`` is a standby's refusal of a write (nothing was done: the call may go elsewhere)."""
    return exc.code() == grpc.StatusCode.FAILED_PRECONDITION and reason_of(_trailing(exc)) == NOT_LEADER


def _trailing(exc: grpc.RpcError) -> Any:
    trailing = getattr(exc, "trailing_metadata", None)  # an error raised before any call has none
    return trailing() if callable(trailing) else None


def no_leader_line(standbys: Sequence[str], silent: Sequence[str]) -> str:
    """``no controller leads now (a:50051, b:50051 are standbys); retry in a few seconds``."""
    who = f"{', '.join(standbys)} {'are standbys' if len(standbys) > 1 else 'is a standby'}"
    if silent:
        who += f"; {', '.join(silent)} {'do' if len(silent) > 1 else 'does'} not answer"
    return f"no controller leads now ({who}); retry in a few seconds"


class Route:
    """Where calls go: the controller that answered first; after a standby's refusal, the one that took the call
    (later writes of the command go straight there)."""

    def __init__(
        self, address: str, channel: grpc.Channel, addresses: Sequence[str], opener: connection.Opener
    ) -> None:
        self.address, self.channel = address, channel
        self.addresses = tuple(addresses)
        self.opener = opener
        self.opened: dict[str, grpc.Channel] = {address: channel}

    def call(self, invoke: Invoke[T]) -> T:
        """``invoke(channel)`` here; if a standby refuses it, once on each other candidate until one takes it."""
        try:
            return invoke(self.channel)
        except grpc.RpcError as exc:
            if not refused_by_standby(exc):
                raise
            leader = leader_of(_trailing(exc))
        standbys, silent = [self.address], []
        for address in self.candidates(leader):
            channel = self._open(address)
            # A leader gone, or named by an address this host cannot reach: no call waits on it.
            if connection.answers(channel, connection.READY_SECONDS):
                silent.append(address)
                continue
            try:
                reply = invoke(channel)
            except grpc.RpcError as exc:
                if not refused_by_standby(exc):
                    raise
                standbys.append(address)
                continue
            self.address, self.channel = address, channel
            return reply
        raise NoLeader(no_leader_line(standbys, silent))

    def candidates(self, leader: str) -> list[str]:
        """The leader a refusal named first, then the other listed controllers, each once, never the refuser."""
        order = [leader] if leader else []
        order += self.addresses
        return [a for i, a in enumerate(order) if a != self.address and a not in order[:i]]

    def _open(self, address: str) -> grpc.Channel:
        if address not in self.opened:
            self.opened[address] = self.opener(address)
        return self.opened[address]

    def close(self) -> None:
        for channel in self.opened.values():
            channel.close()
        self.opened.clear()


class _Following(grpc.UnaryUnaryMultiCallable):  # type: ignore[type-arg]
    """One unary method whose refused calls follow the leader (:meth:`Route.call`)."""

    def __init__(self, route: Route, method: Callable[[grpc.Channel], Any]) -> None:
        self.route, self.method = route, method

    def __call__(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return self.route.call(lambda channel: self.method(channel)(request, *args, **kwargs))

    def with_call(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return self.route.call(lambda channel: self.method(channel).with_call(request, *args, **kwargs))

    def future(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        """Not followed: a future's refusal comes after this returns (the commands make no such call)."""
        return self.method(self.route.channel).future(request, *args, **kwargs)


class LeaderChannel(grpc.Channel):
    """A channel whose unary calls follow the leader; closing it closes every channel it opened."""

    def __init__(self, route: Route) -> None:
        self.route = route

    def unary_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: Any
    ) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        return _Following(
            self.route, lambda channel: channel.unary_unary(method, request_serializer, response_deserializer)
        )

    def unary_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: Any
    ) -> grpc.UnaryStreamMultiCallable[Any, Any]:
        return self.route.channel.unary_stream(method, request_serializer, response_deserializer)

    def stream_unary(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: Any
    ) -> grpc.StreamUnaryMultiCallable[Any, Any]:
        return self.route.channel.stream_unary(method, request_serializer, response_deserializer)

    def stream_stream(
        self, method: str, request_serializer: Any = None, response_deserializer: Any = None, **_: Any
    ) -> grpc.StreamStreamMultiCallable[Any, Any]:
        return self.route.channel.stream_stream(method, request_serializer, response_deserializer)

    def subscribe(self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False) -> None:
        self.route.channel.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        self.route.channel.unsubscribe(callback)

    def close(self) -> None:
        self.route.close()

    def __enter__(self) -> LeaderChannel:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> bool | None:
        self.close()
        return None
