"""The client side: find the controller and the token, open an authenticated channel.

Address: ``--controller``, else ``SPOTMORPH_CONTROLLER``, else the context file ``spotmorph local up``
writes (see :mod:`controller.client.context`). Token:
``--token``, else ``SPOTMORPH_TOKEN``, else that file. grpc is imported here, never by a command
module at import time.

Before its first call a command waits at most :data:`READY_SECONDS` for the controller's health check: an
address that drops packets would otherwise hold a call for gRPC's 20 s connect timeout and end in a raw
UNAVAILABLE.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc

from controller.client.context import context_path, read_context
from controller.files import PEM_LIMIT, read_small
from morphing.errors import UserInputError


def resolve(controller: str | None, token: str | None) -> tuple[str, str | None]:
    context = read_context()
    address = controller or os.environ.get("SPOTMORPH_CONTROLLER") or (context.controller if context else None)
    if not address:
        raise UserInputError(
            "no controller: pass --controller HOST:PORT, set SPOTMORPH_CONTROLLER or `spotmorph local up`"
        )
    return address, token or os.environ.get("SPOTMORPH_TOKEN") or (context.token() if context else None)


READY_SECONDS = 5.0  # a controller that has not answered within this is taken to be absent


class ControllerUnreachable(Exception):
    """No controller answered at the address; ``str()`` is the one line that names the fix."""


def address_source(controller: str | None) -> str:
    """Where :func:`resolve` took the address from, for a message about a stale one."""
    if controller:
        return "--controller"
    if os.environ.get("SPOTMORPH_CONTROLLER"):
        return "SPOTMORPH_CONTROLLER"
    return f"the context file {context_path()} that `spotmorph local up` wrote"


def wait_until_answers(channel: grpc.Channel, address: str, source: str, seconds: float | None = None) -> None:
    """Return once the controller answers its health check (open to every caller); :class:`ControllerUnreachable`
    when the connection fails or no reply comes within ``seconds`` (default :data:`READY_SECONDS`), so no
    command spends its work first. The check opens the connection the command's calls then use."""
    seconds = READY_SECONDS if seconds is None else seconds
    # Bytes in and out (no serializers): b"" is a HealthCheckRequest for the whole server.
    check = channel.unary_unary("/grpc.health.v1.Health/Check", None, None)
    try:
        check(b"", timeout=seconds)
        return
    except grpc.RpcError as exc:
        code = exc.code()
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return  # it answered: a refusal is for the command's own call to report
        detail = str(exc.details() or "").rpartition(": ")[2][:160]  # e.g. Connection refused
    why = (
        f"within {seconds:g} s"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED
        else f"(the connection failed: {detail or code.name}; nothing listens there, or its TLS and --tls-ca do "
        "not match)"
    )
    raise ControllerUnreachable(
        f"no controller answers at {address} (from {source}) {why}: start one with "
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


def channel(
    address: str, token: str | None, ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> grpc.Channel:
    """A channel that sends the bearer token with every call; TLS (mutual with cert/key) when ``ca`` is given."""
    if ca is not None:
        credentials = grpc.ssl_channel_credentials(
            read_small(ca, "--tls-ca", PEM_LIMIT),
            read_small(key, "--tls-key", PEM_LIMIT) if key else None,
            read_small(cert, "--tls-cert", PEM_LIMIT) if cert else None,
        )
        raw = grpc.secure_channel(address, credentials)
    else:
        raw = grpc.insecure_channel(address)
    return grpc.intercept_channel(raw, _Bearer(token)) if token else raw
