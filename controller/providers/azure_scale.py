"""What the Azure provider does with its scale set, decided without the SDK: pure functions and values.

:mod:`controller.providers.azure` is the shell: it lists the set, asks :func:`plan_scale` what to do,
and does it (delete evicted leftovers, scale out, scale in idle instances). The capacity it aims for
is :func:`desired_capacity`: the operator's ``target_capacity`` as a floor, raised to what the
controller asks for (:meth:`Provider.request_capacity`, busy nodes plus queued jobs) up to
``max_capacity``. Because the controller's level counts every busy node, scale-in only ever finds idle
instances above it; busy ones are spared regardless (unless the operator allows deleting them).
Backoff is a value too: capacity errors double it up to a cap, throttling (429) waits for Retry-After.
Each running VM is handed its own agent token once (:func:`needing_token`); a VM whose hand-over
failed is retried on its own clock, not the set's backoff.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from controller.core.events import EventKind

GONE_POWER = frozenset({"deallocated", "deallocating", "stopped", "stopping"})
THROTTLED = EventKind.PROVIDER_THROTTLED
CAPACITY_UNAVAILABLE = EventKind.PROVIDER_CAPACITY_UNAVAILABLE
DEFAULT_RETRY_AFTER_SECONDS = 30.0  # a 429 without a usable Retry-After header
SCALE, CLEAN = "scale", "clean"  # keys of the provider's background operations (one of each at a time)
TOKEN_TASK = "token"  # "token:VM": handing VM its agent token (one at a time per VM)


@dataclass(frozen=True)
class Instance:
    name: str  # the VM name, which is the node name its agent registers under
    instance_id: str  # what delete_instances takes (Uniform: "3"; Flexible: the VM name)
    provisioning: str
    power: str
    location: str = ""  # the VM's region: a Run Command on it names it

    @property
    def running(self) -> bool:
        """Provisioned and powered on: its VM agent can take a Run Command."""
        return self.provisioning.lower() == "succeeded" and self.power == "running"

    @property
    def evicted(self) -> bool:
        return self.power in GONE_POWER or self.provisioning.lower() == "deleting"


@dataclass(frozen=True)
class Failure:
    kind: EventKind  # the event kind: ProviderThrottled, ProviderCapacityUnavailable, ...
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Backoff:
    """When the provider may call Azure again."""

    not_before: float = 0.0  # no call that changes the set before this (capacity errors)
    throttled_until: float = 0.0  # no call at all before this (429 Retry-After)
    seconds: float = 0.0  # the current capacity backoff; doubles on every capacity error

    def may_read(self, now: float) -> bool:
        return now >= self.throttled_until

    def may_change(self, now: float) -> bool:
        return now >= max(self.not_before, self.throttled_until)

    def retry_at(self, now: float) -> float | None:
        """When a call that changes the set is allowed again; None: now."""
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


@dataclass(frozen=True)
class ScaleOut:
    running: int  # instances alive now
    dying: int  # listed but evicted: they still count in the set's capacity until deleted


@dataclass(frozen=True)
class ScalePlan:
    clean: tuple[Instance, ...] = ()  # evicted instances still in the set: delete them
    scale_out: ScaleOut | None = None
    scale_in: tuple[Instance, ...] = ()  # idle instances above the desired capacity: delete them
    deferred: int = 0  # instances above the desired capacity kept because their nodes run jobs


def plan_scale(
    listed: Sequence[Instance],
    desired: int,
    busy: Collection[str],
    *,
    delete_busy: bool,
    pending: Collection[str],
    now: float,
    backoff: Backoff,
) -> ScalePlan:
    """What to start after a list; nothing while backing off or while the same kind of operation runs."""
    if not backoff.may_change(now):
        return ScalePlan()
    evicted = tuple(i for i in listed if i.evicted and i.provisioning.lower() != "deleting")
    alive = [i for i in listed if not i.evicted]
    clean = evicted if evicted and CLEAN not in pending else ()
    if SCALE in pending or len(alive) == desired:
        return ScalePlan(clean)
    if len(alive) < desired:
        return ScalePlan(clean, ScaleOut(len(alive), len(listed) - len(alive)))
    extra = len(alive) - desired
    idle = tuple(i for i in reversed(alive) if delete_busy or i.name not in busy)[:extra]
    return ScalePlan(clean, scale_in=idle, deferred=extra - len(idle))


def capacity_to_set(current: int, desired: int, dying: int) -> int | None:
    """The set's new capacity for a scale-out, or None when it is already that high.

    Instances on their way out still count in the set's capacity until they are gone; a capacity
    already asked for (by this controller before a restart, or an operation still running) is left alone.
    """
    wanted = desired + dying
    return None if current >= wanted else wanted


def may_delete(busy: bool, *, delete_busy: bool, force: bool) -> bool:
    """Never an instance whose node runs a job, unless the operator allows it (setting or ``force``)."""
    return force or delete_busy or not busy


def needing_token(
    listed: Iterable[Instance],
    delivered: Collection[str],
    retry_at: Mapping[str, float],
    pending: Collection[str],
    now: float,
) -> list[Instance]:
    """Running instances whose agent token is not delivered yet: not under way, not waiting to retry."""
    return [
        i
        for i in listed
        if i.running
        and i.name not in delivered
        and f"{TOKEN_TASK}:{i.name}" not in pending
        and retry_at.get(i.name, 0.0) <= now
    ]
