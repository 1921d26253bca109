"""What every cloud provider decides alike, without an SDK: pure functions and values.

The cloud-specific planners (:mod:`.azure_scale`, :mod:`.aws_scale`, :mod:`.gcp_scale`) decide what to do with
their group; what they share lives here. The capacity a provider aims for is :func:`desired_capacity`: the
operator's floor, raised to what the controller asks for (:meth:`Provider.request_capacity`, busy nodes plus
queued jobs) up to a ceiling. Backoff is a value: capacity errors double it up to a cap, throttling waits for
Retry-After (:func:`after_failure`). An instance whose node runs a job is never deleted unless the operator
allows it (:func:`may_delete`). Each running VM is handed its own agent token once (:func:`needing_token`); a VM
whose hand-over failed is retried on its own clock, not the group's backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from controller.core.events import EventKind

THROTTLED = EventKind.PROVIDER_THROTTLED
CAPACITY_UNAVAILABLE = EventKind.PROVIDER_CAPACITY_UNAVAILABLE
DEFAULT_RETRY_AFTER_SECONDS = 30.0  # throttled without a usable Retry-After
SCALE, CLEAN = "scale", "clean"  # keys of a provider's background operations (one of each at a time)
TOKEN_TASK = "token"  # "token:NAME": handing instance NAME its agent token (one at a time per instance)


@dataclass(frozen=True)
class Failure:
    kind: EventKind  # the event kind: ProviderThrottled, ProviderCapacityUnavailable, ...
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Backoff:
    """When the provider may call the cloud again."""

    not_before: float = 0.0  # no call that changes the group before this (capacity errors)
    throttled_until: float = 0.0  # no call at all before this (throttled: Retry-After)
    seconds: float = 0.0  # the current capacity backoff; doubles on every capacity error

    def may_read(self, now: float) -> bool:
        return now >= self.throttled_until

    def may_change(self, now: float) -> bool:
        return now >= max(self.not_before, self.throttled_until)

    def retry_at(self, now: float) -> float | None:
        """When a call that changes the group is allowed again; None: now."""
        at = max(self.not_before, self.throttled_until)
        return at if at > now else None


def after_failure(backoff: Backoff, failure: Failure, now: float, base: float, cap: float) -> Backoff:
    """Throttling waits for Retry-After; a capacity error backs off ``base`` seconds, doubling up to ``cap``."""
    if failure.kind == THROTTLED:
        return replace(backoff, throttled_until=now + (failure.retry_after or DEFAULT_RETRY_AFTER_SECONDS))
    if failure.kind == CAPACITY_UNAVAILABLE:
        seconds = min(cap, max(base, backoff.seconds * 2))
        return replace(backoff, seconds=seconds, not_before=now + seconds)
    return backoff


def after_success(backoff: Backoff) -> Backoff:
    """An operation went through: the next capacity error starts from the base backoff again."""
    return replace(backoff, seconds=0.0)


def desired_capacity(target: int, maximum: int | None, wanted_instances: int) -> int:
    """``target`` as a floor, raised to the controller's wanted level, never above ``maximum`` (None: target)."""
    ceiling = target if maximum is None else max(target, maximum)
    return min(max(target, wanted_instances), ceiling)


def may_delete(busy: bool, *, delete_busy: bool, force: bool) -> bool:
    """Never an instance whose node runs a job, unless the operator allows it (setting or ``force``)."""
    return force or delete_busy or not busy


class Runs(Protocol):
    @property
    def running(self) -> bool: ...


R = TypeVar("R", bound=Runs)


def token_key(name: str) -> str:
    """The background operation handing instance ``name`` its agent token."""
    return f"{TOKEN_TASK}:{name}"


def needing_token(
    listed: Iterable[R],
    name: Callable[[R], str],
    delivered: Collection[str],
    retry_at: Mapping[str, float],
    pending: Collection[str],
    now: float,
) -> list[R]:
    """Running instances whose agent token is not delivered yet: not under way, not waiting to retry."""
    return [
        i
        for i in listed
        if i.running
        and name(i) not in delivered
        and token_key(name(i)) not in pending
        and retry_at.get(name(i), 0.0) <= now
    ]
