"""The client side: find a controller and the token, open authenticated channels.

Addresses: ``--controller``, else ``SPOTMORPH_CONTROLLER``, else the context file ``spotmorph local up``
writes (see :mod:`controller.client.context`); each may list several controllers (``a:50051,b:50051``), one
leading and the others standing by. Token: ``--token``, else ``SPOTMORPH_TOKEN``, else that file. grpc is
imported here, never by a command module at import time.

Before its first call a command waits at most :data:`READY_SECONDS` for a controller's health check, trying
the addresses in order: an address that drops packets would otherwise hold a call for gRPC's 20 s connect
timeout and end in a raw UNAVAILABLE. Writes a standby refuses follow the leader
(:mod:`controller.client.leader`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from controller.client.context import context_path, read_context
from controller.files import PEM_LIMIT, read_small
from morphing.errors import UserInputError
from protos.addresses import parse_addresses


def resolve(controller: str | None, token: str | None) -> tuple[tuple[str, ...], str | None]:
    """The controllers to try, in order (each entry checked), and the token."""
    context = read_context()
    source = address_source(controller)
    if controller:
        addresses = parse_addresses(controller, source)
    elif os.environ.get("SPOTMORPH_CONTROLLER"):
        addresses = parse_addresses(os.environ["SPOTMORPH_CONTROLLER"], source)
    elif context and context.addresses():
        addresses = parse_addresses(",".join(context.addresses()), source)
    else:
        raise UserInputError(
            "no controller: pass --controller HOST:PORT, set SPOTMORPH_CONTROLLER or `spotmorph local up`"
        )
    return addresses, token or os.environ.get("SPOTMORPH_TOKEN") or (context.token() if context else None)


READY_SECONDS = 5.0  # a controller that has not answered within this is taken to be absent


class ControllerUnreachable(Exception):
    """No controller answered at any address; ``str()`` is the one line that names the fix."""


def address_source(controller: str | None) -> str:
    """Where :func:`resolve` took the address from, for a message about a stale one."""
    if controller:
        return "--controller"
    if os.environ.get("SPOTMORPH_CONTROLLER"):
        return "SPOTMORPH_CONTROLLER"
    return f"the context file {context_path()} that `spotmorph local up` wrote"


def answers(channel: grpc.Channel, seconds: float) -> str:
    """'' once the controller at ``channel`` answers its health check (open to every caller); else why not, as
    a phrase for :class:`ControllerUnreachable`'s line. The check opens the connection later calls use."""
    # Bytes in and out (no serializers): b"" is a HealthCheckRequest for the whole server.
    check = channel.unary_unary("/grpc.health.v1.Health/Check", None, None)
    try:
        check(b"", timeout=seconds)
        return ""
    except grpc.RpcError as exc:
        code = exc.code()
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ""  # it answered: a refusal is for the command's own call to report
        detail = str(exc.details() or "").rpartition(": ")[2][:160]  # e.g. Connection refused
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"within {seconds:g} s"
    return (
        f"(the connection failed: {detail or code.name}; nothing listens there, or its TLS and --tls-ca do not match)"
    )


def wait_until_answers(
    addresses: Sequence[str], opener: Opener, source: str, seconds: float | None = None
) -> tuple[str, grpc.Channel]:
    """The first of ``addresses`` whose controller answers, with its channel, so no command spends its work
    first; :class:`ControllerUnreachable` naming every address when none answers within ``seconds`` each
    (default :data:`READY_SECONDS`). A standby answers too: reads go to it, writes follow its leader."""
    seconds = READY_SECONDS if seconds is None else seconds
    failed: list[str] = []
    for address in addresses:
        channel = opener(address)
        why = answers(channel, seconds)
        if not why:
            return address, channel
        channel.close()
        failed.append(f"{address} (from {source}) {why}" if not failed else f"{address} {why}")
    raise ControllerUnreachable(
        f"no controller answers at {', nor at '.join(failed)}: start one with "
        "`spotmorph controller` or `spotmorph local up`, or name a running one with --controller HOST:PORT "
        "or SPOTMORPH_CONTROLLER"
    )


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, token: str) -> None:
        self.header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or []), self.header])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


@dataclass(frozen=True)
class Opener:
    """Opens a channel to any controller with the same token and TLS: the files are read once, before any
    connection (a bad one is the user's error), and a leader a standby names gets the same settings."""

    token: str | None
    credentials: grpc.ChannelCredentials | None

    @classmethod
    def of(cls, token: str | None, ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> Opener:
        """TLS (mutual with cert/key) when ``ca`` is given."""
        if ca is None:
            return cls(token, None)
        credentials = grpc.ssl_channel_credentials(
            read_small(ca, "--tls-ca", PEM_LIMIT),
            read_small(key, "--tls-key", PEM_LIMIT) if key else None,
            read_small(cert, "--tls-cert", PEM_LIMIT) if cert else None,
        )
        return cls(token, credentials)

    def __call__(self, address: str) -> grpc.Channel:
        """A channel to ``address`` that sends the bearer token with every call."""
        if self.credentials is not None:
            raw = grpc.secure_channel(address, self.credentials)
        else:
            raw = grpc.insecure_channel(address)
        return grpc.intercept_channel(raw, _Bearer(self.token)) if self.token else raw


def channel(
    address: str, token: str | None, ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> grpc.Channel:
    """A channel that sends the bearer token with every call; TLS (mutual with cert/key) when ``ca`` is given."""
    return Opener.of(token, ca, cert, key)(address)
