"""Who may call what: bearer tokens with roles, checked by one server interceptor.

Roles: ``operator`` (submit, cancel, and everything a reader may do), ``reader`` (look only),
``agent`` (may only register a node) and ``node`` (the token Register hands out: heartbeats and
reports as that node and incarnation only). Node tokens are an HMAC of the node's name and
incarnation under a secret in the state directory, so they survive a controller restart without being
stored. Agent tokens are per VM: an HMAC of the VM's instance id under a key derived from the same
secret, issued by the provider that creates the VM (or ``spotmorph agent-token`` for a manual node), so
a registration proves which instance it comes from instead of claiming it. The shared agent token
(every VM the same, instance ids claimed) is accepted only where the operator enables it. Health
checking and reflection need no token: they reveal nothing about jobs; nor does Identity, whose request
is a document the cloud signed (controller.api.identity).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from controller.tokens import (
    INSTANCE_ID,
    NODE_SECRET,
    VM_TOKEN_PREFIX,
    Principal,
    Role,
    Tokens,
    issue_vm_token,
    read_or_create_token,
    token_secret,
)

__all__ = [
    "INSTANCE_ID",
    "NODE_SECRET",
    "OPEN_SERVICES",
    "POLICY",
    "VM_TOKEN_PREFIX",
    "AuthInterceptor",
    "Principal",
    "Role",
    "Tokens",
    "issue_vm_token",
    "principal_of",
    "read_or_create_token",
    "token_secret",
]

# Callable without a token. Identity's request carries its own credential (a document the cloud signed).
OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.",
    "/spotmorph.v1.Identity/",
)

# Method name -> roles allowed to call it. A method missing here is refused for everyone.
POLICY: Mapping[str, frozenset[Role]] = {
    "/spotmorph.v1.Jobs/SubmitJob": frozenset({Role.OPERATOR}),
    "/spotmorph.v1.Jobs/CancelJob": frozenset({Role.OPERATOR}),
    "/spotmorph.v1.Jobs/GetJob": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Jobs/ListJobs": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Jobs/WatchEvents": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Jobs/WatchLogs": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Cluster/ListNodes": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Cluster/GetClusterState": frozenset({Role.OPERATOR, Role.READER}),
    "/spotmorph.v1.Agent/Register": frozenset({Role.AGENT}),
    "/spotmorph.v1.Agent/Heartbeat": frozenset({Role.NODE}),
    "/spotmorph.v1.Agent/ReportEvent": frozenset({Role.NODE}),
    "/spotmorph.v1.Agent/ReportLogs": frozenset({Role.NODE}),
}


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
