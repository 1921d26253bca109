"""AWS's errors as the provider's events: what happened, in words an operator can act on, and whether to try again.

Kept apart from :mod:`controller.providers.aws` (the shell) so that the shell stays one screenful of calls; the
codes themselves are :mod:`controller.providers.aws_scale`'s (pure).
"""

from __future__ import annotations

from typing import Any

import botocore.exceptions as aws_errors  # type: ignore[import-untyped]
import botocore.parsers  # type: ignore[import-untyped]

from controller.core.events import EventKind
from controller.providers import aws_scale as scale
from controller.providers.aws_scale import MalformedResponse
from controller.providers.aws_tokens import HandOverFailed
from controller.providers.scaling import Failure

K = EventKind


class GroupNotFound(Exception):
    """DescribeAutoScalingGroups answered without the group."""


def describe(exc: BaseException, throttle_seconds: float = 30.0) -> Failure:
    """An AWS error as one event: what happened, in words an operator can act on."""
    if isinstance(exc, aws_errors.ClientError):
        code, status = scale.error_code(exc), _status(exc)
        message = short(exc.response.get("Error", {}).get("Message") if isinstance(exc.response, dict) else exc)
        kind = scale.failure_kind(code, status, message)
        said = f"{code or status}: {message}"
        if kind == K.PROVIDER_THROTTLED:
            return Failure(kind, f"throttled ({code or status}), no call for {throttle_seconds:g} s", throttle_seconds)
        if kind == K.PROVIDER_AUTH_FAILED:
            return Failure(kind, f"not authorised: {said} (check the controller's instance profile: docs/aws.md)")
        if kind == K.PROVIDER_NOT_FOUND:
            return Failure(kind, f"not found: {said} (check region and auto_scaling_group)")
        return Failure(kind, said)
    if isinstance(exc, GroupNotFound):
        return Failure(K.PROVIDER_NOT_FOUND, f"{short(exc)} (check region and auto_scaling_group)")
    if isinstance(exc, aws_errors.NoCredentialsError | aws_errors.PartialCredentialsError):
        return Failure(K.PROVIDER_AUTH_FAILED, f"{short(exc)} (the controller's instance profile, or `profile:`)")
    if isinstance(exc, aws_errors.ConnectionError | aws_errors.HTTPClientError | TimeoutError):
        return Failure(K.PROVIDER_UNREACHABLE, f"cannot reach AWS: {short(exc) or type(exc).__name__}")
    if isinstance(exc, botocore.parsers.ResponseParserError):
        return Failure(K.PROVIDER_ERROR, f"an answer that is not AWS's: {short(exc)}")
    if isinstance(exc, MalformedResponse | HandOverFailed | aws_errors.BotoCoreError):
        return Failure(K.PROVIDER_ERROR, short(exc))
    return Failure(K.PROVIDER_ERROR, f"{type(exc).__name__}: {short(exc)}")


def _status(exc: Any) -> int | None:
    metadata = exc.response.get("ResponseMetadata") if isinstance(exc.response, dict) else None
    status = metadata.get("HTTPStatusCode") if isinstance(metadata, dict) else None
    return status if isinstance(status, int) else None


def short(value: object) -> str:
    return " ".join(str(value).split())[:300]


def retryable(exc: BaseException) -> bool:
    """Throttling, AWS's own failures (5xx), timeouts and lost connections: worth another try at once."""
    if isinstance(exc, aws_errors.ClientError):
        return scale.transient(describe(exc).kind, _status(exc))
    return isinstance(exc, aws_errors.ConnectionError | aws_errors.HTTPClientError | TimeoutError)


def throttled(exc: BaseException) -> bool:
    """AWS refused the call for its rate: it did not run."""
    return isinstance(exc, aws_errors.ClientError) and describe(exc).kind == K.PROVIDER_THROTTLED
