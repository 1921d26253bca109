"""What went wrong with a Compute Engine call, in the provider events' words, and whether to retry it.

The REST client raises ``google.api_core`` exceptions built from the HTTP answer (status, ``error.errors[]
.reason``), ``requests`` errors when nothing answered, and ``google.auth`` errors when credentials fail; a
zone operation that ended in error is :class:`OperationFailed` (its ``error.errors[].code``). Rate limits
come as 429 or as 403 with reason ``rateLimitExceeded``; quota as 403 ``quotaExceeded`` or an operation's
``QUOTA_EXCEEDED``. Every message is cut short: an answer's text is the API's (or a fake's), not ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth

from controller.core.events import EventKind
from controller.providers import scaling as backoff
from controller.providers.gcp_scale import CAPACITY_CODES
from controller.providers.scaling import Failure

K = EventKind
RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"})
QUOTA_REASONS = frozenset({"quotaExceeded", "QUOTA_EXCEEDED", "limitExceeded"})
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS = 600.0


class OperationFailed(Exception):
    """A zone operation ended DONE with errors: their codes and messages."""

    def __init__(self, operation: str, codes: Iterable[str], message: str, status: int = 0) -> None:
        self.codes = tuple(codes)
        self.status = status
        super().__init__(f"{operation}: {message}")


def short(exc: BaseException | str) -> str:
    text = exc if isinstance(exc, str) else getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:300]


def reasons(exc: api.GoogleAPICallError) -> frozenset[str]:
    """The ``reason`` of every entry of the answer's ``error.errors`` (and its ErrorInfo), whatever their shape."""
    found: set[str] = set()
    for entry in exc.errors if isinstance(exc.errors, list | tuple) else ():
        reason = entry.get("reason") if isinstance(entry, dict) else getattr(entry, "reason", None)
        if isinstance(reason, str):
            found.add(reason)
    if isinstance(exc.reason, str):
        found.add(exc.reason)
    return frozenset(found)


def retry_after(exc: BaseException) -> float | None:
    """The seconds a Retry-After header asks for, if the answer had a usable one."""
    response: Any = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    value = headers.get("Retry-After") if headers is not None and hasattr(headers, "get") else None
    if not isinstance(value, str):
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(MAX_RETRY_AFTER_SECONDS, max(0.0, seconds)) if seconds == seconds else None  # NaN: none


def throttled(exc: BaseException) -> bool:
    if not isinstance(exc, api.GoogleAPICallError):
        return False
    return exc.code == 429 or (exc.code == 403 and bool(reasons(exc) & RATE_REASONS))


def unreachable(exc: BaseException) -> bool:
    """Nothing (usable) answered: refused, reset, timed out, or a server error."""
    if isinstance(exc, api.GoogleAPICallError):
        return exc.code in RETRYABLE_STATUS and exc.code != 429
    return isinstance(exc, requests.RequestException | auth.TransportError | TimeoutError | ConnectionError)


def retry_wait(exc: BaseException, attempt: int, first: float) -> float | None:
    """How long to wait before retrying a call that failed so (``attempt``: retries so far); None: do not."""
    if not (throttled(exc) or unreachable(exc)):
        return None
    after = retry_after(exc)
    return after if after is not None else first * 2**attempt


def describe(exc: BaseException) -> Failure:
    """A Compute Engine error as one event: what happened, in words an operator can act on."""
    if isinstance(exc, OperationFailed):
        if set(exc.codes) & CAPACITY_CODES:
            return Failure(K.PROVIDER_CAPACITY_UNAVAILABLE, short(exc))
        if set(exc.codes) & RATE_REASONS:
            return Failure(backoff.THROTTLED, short(exc), backoff.DEFAULT_RETRY_AFTER_SECONDS)
        return Failure(K.PROVIDER_ERROR, f"operation failed: {short(exc)}")
    if isinstance(exc, api.GoogleAPICallError):
        return _api_failure(exc)
    if unreachable(exc):
        return Failure(K.PROVIDER_UNREACHABLE, f"cannot reach the Compute Engine API: {short(exc)}")
    if isinstance(exc, auth.GoogleAuthError):
        hint = "(check the service account, or Application Default Credentials)"
        return Failure(K.PROVIDER_AUTH_FAILED, f"no credentials: {short(exc)} {hint}")
    return Failure(K.PROVIDER_ERROR, f"{type(exc).__name__}: {short(exc)}")


def _api_failure(exc: api.GoogleAPICallError) -> Failure:
    status, why = exc.code, reasons(exc)
    if throttled(exc):
        after = retry_after(exc) or backoff.DEFAULT_RETRY_AFTER_SECONDS
        return Failure(backoff.THROTTLED, f"rate limited ({status}), retry after {after:g} s: {short(exc)}", after)
    if why & QUOTA_REASONS:
        return Failure(K.PROVIDER_CAPACITY_UNAVAILABLE, f"quota: {short(exc)}")
    if status in (401, 403):
        role = "(check the service account's role: Compute Instance Admin on the project)"
        return Failure(K.PROVIDER_AUTH_FAILED, f"{status}: {short(exc)} {role}")
    if status == 404:
        return Failure(K.PROVIDER_NOT_FOUND, f"not found: {short(exc)} (check project, zone and instance_group)")
    if status in (409, 412):
        return Failure(K.PROVIDER_CONFLICT, f"conflict (another change to the group?): {short(exc)}")
    if unreachable(exc):
        return Failure(K.PROVIDER_UNREACHABLE, f"Compute Engine API error {status}: {short(exc)}")
    return Failure(K.PROVIDER_ERROR, f"{status}: {short(exc)}")
