"""Errors as gRPC statuses, the same way in every service.

Bad input is INVALID_ARGUMENT (the message names the field), unknown ids NOT_FOUND, writes fenced off
(an old incarnation or generation) or a resource another job holds FAILED_PRECONDITION, a live node's
name claimed by another instance (or the log of a rank another node ran) PERMISSION_DENIED, a used name or
key ALREADY_EXISTS, limits RESOURCE_EXHAUSTED, and a controller that cannot decide right now UNAVAILABLE
(retry); anything unexpected is INTERNAL for that call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NoReturn, TypeAlias

import grpc

from controller.core.intake import Conflict, Full, NotOwner, Stale, Taken
from controller.core.logs import NotRun
from controller.shell.failures import DecisionsFailed, NotLeader, OutOfDescriptors, Refused
from morphing.errors import UserInputError
from protos.reasons import NOT_LEADER, REASON_KEY

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# Checked in order: the first type an error is an instance of gives its status.
STATUS_OF_ERROR: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (Stale, grpc.StatusCode.FAILED_PRECONDITION),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (NotOwner, grpc.StatusCode.PERMISSION_DENIED),
    (NotRun, grpc.StatusCode.PERMISSION_DENIED),  # a node sending the log of a rank it did not run
    (Taken, grpc.StatusCode.ALREADY_EXISTS),
    (Full, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotLeader, grpc.StatusCode.FAILED_PRECONDITION),  # deposed mid-call: nothing written, ask the leader
    (DecisionsFailed, grpc.StatusCode.UNAVAILABLE),
    (OutOfDescriptors, grpc.StatusCode.UNAVAILABLE),
    (LookupError, grpc.StatusCode.NOT_FOUND),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),  # UserInputError and a refused report are ones
)
# What a handler may refuse a call with; any other exception (a KeyError included) is a bug, not an answer.
REFUSALS = (
    Stale,
    Conflict,
    NotOwner,
    NotRun,
    Taken,
    Full,
    DecisionsFailed,
    OutOfDescriptors,
    LookupError,
    UserInputError,
    Refused,
)


async def abort(context: Context, code: grpc.StatusCode, detail: str, reason: str = "") -> NoReturn:
    """End the call; ``reason``: a word from :mod:`protos.reasons` the caller decides on (trailing metadata)."""
    if reason:
        context.set_trailing_metadata(((REASON_KEY, reason),))
    await context.abort(code, detail)
    raise AssertionError("unreachable")  # abort raises


async def abort_for(context: Context, error: Exception, reason: str = "") -> NoReturn:
    """End the call with the status :data:`STATUS_OF_ERROR` gives ``error``, its message as the detail."""
    code = next((code for kind, code in STATUS_OF_ERROR if isinstance(error, kind)), grpc.StatusCode.INTERNAL)
    await abort(context, code, str(error), reason or (NOT_LEADER if isinstance(error, NotLeader) else ""))


@asynccontextmanager
async def answered(context: Context) -> AsyncIterator[None]:
    """Any refusal raised inside ends the call with its status (``async with answered(context): ...``)."""
    try:
        yield
    except (KeyError, IndexError):
        raise
    except REFUSALS as exc:
        await abort_for(context, exc)
