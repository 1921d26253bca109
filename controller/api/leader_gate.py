"""Only the leader writes: a standby refuses every write call, naming the leader, before any handler runs.

The refusal is FAILED_PRECONDITION with the reason ``not-leader`` and the leader's address (protos.reasons),
so a client or agent sends the call there. Reads (jobs, nodes, events, logs) a standby answers from the
database. Health and reflection are open on both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc

from protos.reasons import LEADER_KEY, NOT_LEADER, REASON_KEY

# The calls that change state, or act on what only the leader holds (agents' heartbeats and reports).
WRITES = frozenset(
    {
        "/spotmorph.v1.Jobs/SubmitJob",
        "/spotmorph.v1.Jobs/CancelJob",
        "/spotmorph.v1.Agent/Register",
        "/spotmorph.v1.Agent/Heartbeat",
        "/spotmorph.v1.Agent/ReportEvent",
        "/spotmorph.v1.Agent/ReportLogs",
    }
)


class Leading(Protocol):
    @property
    def leading(self) -> bool: ...

    @property
    def epoch(self) -> int: ...

    def leader_address(self) -> str: ...


def not_leader_detail(leader: str) -> str:
    if leader:
        return f"this controller is a standby; the leader is {leader}: send writes there"
    return "no controller leads right now (the lease is being taken over); retry in a few seconds"


async def refuse_not_leader(context: grpc.aio.ServicerContext[Any, Any], leader: str) -> None:
    """End the call as a standby's refusal (a handler's own check, for a call that began while leading)."""
    context.set_trailing_metadata(((REASON_KEY, NOT_LEADER), (LEADER_KEY, leader)))
    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, not_leader_detail(leader))


class LeaderGate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, leadership: Leading) -> None:
        self.leadership = leadership

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if handler_call_details.method not in WRITES or self.leadership.leading:
            return await continuation(handler_call_details)
        leader = self.leadership.leader_address()

        async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await refuse_not_leader(context, leader)

        return grpc.unary_unary_rpc_method_handler(refuse)
