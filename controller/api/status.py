"""Errors as gRPC statuses, the same way in every service.

Bad input is INVALID_ARGUMENT (the message names the field), unknown ids NOT_FOUND, writes fenced off
(an old incarnation or generation) FAILED_PRECONDITION; anything unexpected is INTERNAL for that call.
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeAlias

import grpc

from controller.core.intake import Stale

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# Checked in order: the first type an error is an instance of gives its status.
STATUS_OF_ERROR: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (Stale, grpc.StatusCode.FAILED_PRECONDITION),
    (LookupError, grpc.StatusCode.NOT_FOUND),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),  # UserInputError is one
)


async def abort(context: Context, code: grpc.StatusCode, detail: str) -> NoReturn:
    await context.abort(code, detail)
    raise AssertionError("unreachable")  # abort raises


async def abort_for(context: Context, error: Exception) -> NoReturn:
    """End the call with the status :data:`STATUS_OF_ERROR` gives ``error``, its message as the detail."""
    code = next((code for kind, code in STATUS_OF_ERROR if isinstance(error, kind)), grpc.StatusCode.INTERNAL)
    await abort(context, code, str(error))
