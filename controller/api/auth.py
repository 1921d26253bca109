"""Who may call what: bearer tokens with roles, checked by one server interceptor.

Roles: ``operator`` (submit, cancel, and everything a reader may do), ``reader`` (look only),
``agent`` (may only register a node) and ``node`` (the token Register hands out: heartbeats and
reports as that node and incarnation only). Node tokens are an HMAC of the node's name and
incarnation under a secret in the state directory, so they survive a controller restart without being
stored. Health checking and reflection need no token: they reveal nothing about jobs.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc

from controller.files import TOKEN_LIMIT, read_small_text, write_private

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.")


class Role(StrEnum):
    OPERATOR = "operator"
    READER = "reader"
    AGENT = "agent"
    NODE = "node"


# Method name -> roles allowed to call it. A method missing here is refused for everyone.
POLICY: Mapping[str, frozenset[Role]] = {
    "/spotmorph.v1.Jobs/SubmitJob": frozenset({Role.OPERATOR}),
    "/spotmorph.v1.Jobs/CancelJob": frozenset({Role.OPERATOR}),
    "/spotmorph.v1.Jobs/GetJob": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Jobs/ListJobs": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Jobs/WatchEvents": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Cluster/ListNodes": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Cluster/GetClusterState": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Agent/Register": frozenset({Role.AGENT}),
    "/spotmorph.v1.Agent/Heartbeat": frozenset({Role.NODE}),
    "/spotmorph.v1.Agent/ReportEvent": frozenset({Role.NODE}),
}


@dataclass(frozen=True)
class Principal:
    role: Role
    node: str | None = None
    incarnation: int | None = None


def read_or_create_token(path: Path, flag: str = "token file") -> str:
    """The token in ``path``; a new random one (mode 0600) when the file is missing.

    New tokens start with ``smt_`` so that one never begins with ``-``, which a command line would
    take for an option (``--token -abc`` fails to parse).
    """
    if path.exists():
        token = read_small_text(path, flag, TOKEN_LIMIT).strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    token = "smt_" + secrets.token_urlsafe(32)
    write_private(path, f"{token}\n".encode())
    return token


class Tokens:
    """Static tokens by role, plus node tokens derived from a secret."""

    def __init__(self, static: Mapping[str, Role], secret: bytes) -> None:
        self.static = dict(static)
        self.secret = secret

    def node_token(self, node: str, incarnation: int) -> str:
        mac = hmac.new(self.secret, f"{node}\x00{incarnation}".encode(), hashlib.sha256).hexdigest()
        return f"node.{node}.{incarnation}.{mac}"

    def identify(self, token: str) -> Principal | None:
        for known, role in self.static.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return Principal(role)
        parts = token.removeprefix("node.").rsplit(".", 2)
        if token.startswith("node.") and len(parts) == 3 and parts[1].isdigit() and len(parts[1]) < 19:
            node, incarnation = parts[0], int(parts[1])
            if hmac.compare_digest(self.node_token(node, incarnation).encode(), token.encode()):
                return Principal(Role.NODE, node, incarnation)
        return None


def bearer(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :].strip()
    return None


_PRINCIPAL_KEY = "spotmorph-principal"


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """UNAUTHENTICATED without a known token, PERMISSION_DENIED for the wrong role."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        if method.startswith(OPEN_SERVICES):
            return await continuation(handler_call_details)
        token = bearer(handler_call_details.invocation_metadata)
        principal = self.tokens.identify(token) if token else None
        if principal is None:
            return _deny(grpc.StatusCode.UNAUTHENTICATED, "a valid bearer token is required")
        if principal.role not in POLICY.get(method, frozenset()):
            return _deny(grpc.StatusCode.PERMISSION_DENIED, f"role {principal.role} may not call {method}")
        return await continuation(handler_call_details)


def principal_of(context: grpc.aio.ServicerContext[Any, Any], tokens: Tokens) -> Principal | None:
    token = bearer(context.invocation_metadata())
    return tokens.identify(token) if token else None


def _deny(code: grpc.StatusCode, detail: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that only aborts; the request is never parsed, so no caller without rights reaches a decoder."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, detail)

    return grpc.unary_unary_rpc_method_handler(deny)
