"""What the AWS provider does with its Auto Scaling group, decided without boto3: pure functions and values.

:mod:`controller.providers.aws` is the shell: it describes the group, asks :func:`plan_scale` what to do and
does it. The group replaces interrupted Spot instances by itself (it keeps its desired capacity), so the
provider only moves the desired capacity: up with SetDesiredCapacity; down by terminating instances it chose
(idle ones, never one whose node runs a job) with TerminateInstanceInAutoScalingGroup, decrementing the
desired capacity with each, because a lowered desired capacity would let the group pick which instances go.
Every answer AWS gives is read by :func:`parse_group`, which refuses a malformed one with a clear error.
Backoff, failures and the token bookkeeping are every cloud's (:mod:`controller.providers.scaling`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from controller.core.events import EventKind
from controller.providers.scaling import SCALE, Backoff

INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
# Instances that exist for the group and run (or boot) an agent; Terminating, Terminated, Detaching, Detached
# and warm-pool instances are gone from the controller's point of view.
ALIVE = frozenset({"Pending", "Pending:Wait", "Pending:Proceed", "InService", "EnteringStandby", "Standby"})
MAX_COUNT = 100_000

THROTTLING_CODES = frozenset(
    {"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException", "RequestThrottled"}
)
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "UnfulfillableCapacity",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "LimitExceeded",  # autoscaling: too many groups or launch configurations
    }
)
AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
    }
)
CONFLICT_CODES = frozenset({"ScalingActivityInProgress", "ResourceContention", "ResourceInUse"})


class MalformedResponse(ValueError):
    """AWS (or whatever answered at its address) sent something that is not what the API documents."""


@dataclass(frozen=True)
class Instance:
    id: str  # the EC2 instance id, which is the node name its agent registers under
    lifecycle: str  # InService, Pending, Terminating, ...
    health: str = "Healthy"
    instance_type: str = ""
    zone: str = ""

    @property
    def alive(self) -> bool:
        return self.lifecycle in ALIVE

    @property
    def running(self) -> bool:
        """In service: booted, so its SSM agent can take a Run Command soon if not already."""
        return self.lifecycle == "InService"


@dataclass(frozen=True)
class Group:
    name: str
    desired: int
    min_size: int
    max_size: int
    instances: tuple[Instance, ...]

    @property
    def alive(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.alive)


def parse_group(document: Any, name: str) -> Group | None:
    """The group ``name`` in a DescribeAutoScalingGroups answer; None when it is not there (no such group)."""
    groups = _field(document, "AutoScalingGroups", list, "DescribeAutoScalingGroups")
    for group in groups:
        if _field(group, "AutoScalingGroupName", str, "a group") != name:
            continue
        where = f"group {name[:80]}"
        instances = _field(group, "Instances", list, where) if "Instances" in group else []
        return Group(
            name,
            _count(group, "DesiredCapacity", where),
            _count(group, "MinSize", where),
            _count(group, "MaxSize", where),
            tuple(_instance(item, where) for item in instances),
        )
    return None


def _instance(item: Any, where: str) -> Instance:
    instance_id = _field(item, "InstanceId", str, f"an instance of {where}")
    if not INSTANCE_ID.match(instance_id):
        raise MalformedResponse(f"{where}: {instance_id[:40]!r} is not an EC2 instance id")
    where = f"instance {instance_id}"
    return Instance(
        instance_id,
        _field(item, "LifecycleState", str, where)[:40],
        str(_optional(item, "HealthStatus", str, where) or "Healthy")[:40],
        str(_optional(item, "InstanceType", str, where) or "")[:40],
        str(_optional(item, "AvailabilityZone", str, where) or "")[:40],
    )


def _field(value: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(value, dict):
        raise MalformedResponse(f"{where}: expected an object, got {type(value).__name__}")
    if key not in value:
        raise MalformedResponse(f"{where}: {key} is missing")
    found = value[key]
    if not isinstance(found, kind) or isinstance(found, bool):
        raise MalformedResponse(f"{where}: {key} is {type(found).__name__}, not {kind.__name__}")
    return found


def _optional(value: dict[str, Any], key: str, kind: type, where: str) -> Any:
    return _field(value, key, kind, where) if value.get(key) is not None else None


def _count(value: dict[str, Any], key: str, where: str) -> int:
    found: int = _field(value, key, int, where)
    if not 0 <= found <= MAX_COUNT:
        raise MalformedResponse(f"{where}: {key} {found} is out of range")
    return found


def ceiling(max_capacity: int | None, group: Group) -> int:
    """The most instances the provider may ask for: its own max_capacity within the group's MaxSize."""
    return group.max_size if max_capacity is None else min(max_capacity, group.max_size)


def desired_capacity(min_capacity: int, max_capacity: int | None, group: Group, wanted: int) -> int:
    """The controller's wanted instances, raised to the floor, within the ceiling and the group's MinSize."""
    return max(group.min_size, min(max(min_capacity, wanted), ceiling(max_capacity, group)))


@dataclass(frozen=True)
class ScalePlan:
    set_desired: int | None = None  # SetDesiredCapacity first (raise; or meet the instances before scale-in)
    terminate: tuple[Instance, ...] = ()  # idle instances above the desired capacity, each decrementing it
    deferred: int = 0  # instances above the desired capacity kept because their nodes run jobs


def plan_scale(
    group: Group,
    desired: int,
    busy: Collection[str],
    *,
    delete_busy: bool,
    pending: Collection[str],
    now: float,
    backoff: Backoff,
) -> ScalePlan:
    """What to change after a describe; nothing while backing off or while a scaling operation runs.

    Up: the group's desired capacity is raised and the group launches. Down: the desired capacity is first
    brought to the instances there are (so the group itself terminates nothing), then the provider terminates
    idle ones, booting ones first (no agent yet), each decrementing the desired capacity by one."""
    if not backoff.may_change(now) or SCALE in pending:
        return ScalePlan()
    alive = group.alive
    if group.desired < desired:
        return ScalePlan(set_desired=desired)
    extra = len(alive) - desired
    if extra <= 0:
        return ScalePlan(set_desired=desired) if group.desired > desired else ScalePlan()
    order = [i for i in reversed(alive) if not i.running] + [i for i in reversed(alive) if i.running]
    idle = tuple(i for i in order if delete_busy or i.id not in busy)[:extra]
    # Each termination decrements: from the instances there are down to the desired capacity. With none to
    # terminate, the group is only stopped from launching more (never raised above the desired capacity).
    meet = len(alive) if group.desired > len(alive) or (idle and group.desired != len(alive)) else None
    return ScalePlan(meet, idle, extra - len(idle))


def failure_kind(code: str | None, status: int | None, message: str) -> EventKind:
    """The event kind of an AWS error answer: its code first, then its HTTP status."""
    if code in THROTTLING_CODES or status == 429 or "rate exceeded" in message.lower():
        return EventKind.PROVIDER_THROTTLED
    if code in CAPACITY_CODES:
        return EventKind.PROVIDER_CAPACITY_UNAVAILABLE
    if code in AUTH_CODES or status in (401, 403):
        return EventKind.PROVIDER_AUTH_FAILED
    if code in CONFLICT_CODES or status == 409:
        return EventKind.PROVIDER_CONFLICT
    if status == 404 or (code == "ValidationError" and "not found" in message.lower()):
        return EventKind.PROVIDER_NOT_FOUND
    return EventKind.PROVIDER_ERROR


def transient(kind: EventKind, status: int | None) -> bool:
    """Worth trying again at once (with a growing wait): throttling and AWS's own failures (5xx)."""
    return kind == EventKind.PROVIDER_THROTTLED or (status is not None and status >= 500)


def launch_failures(document: Any, seen: Collection[str]) -> list[tuple[str, str]]:
    """(activity id, message) of the failed launches in a DescribeScalingActivities answer not seen before.

    A failed launch for want of Spot capacity is how the group says it cannot reach its desired capacity;
    the group retries by itself, so this is only said, once per activity."""
    found: list[tuple[str, str]] = []
    for activity in _field(document, "Activities", list, "DescribeScalingActivities"):
        where = "a scaling activity"
        activity_id = _field(activity, "ActivityId", str, where)[:80]
        status = _field(activity, "StatusCode", str, where)
        if status not in ("Failed", "Cancelled") or activity_id in seen:
            continue
        message = str(_optional(activity, "StatusMessage", str, where) or _field(activity, "Description", str, where))
        found.append((activity_id, " ".join(message.split())[:300]))
    return found


def launch_failure_kind(message: str) -> EventKind:
    """A failed launch for want of Spot capacity or quota, or another error (an AMI gone, a role missing)."""
    if any(code in message for code in CAPACITY_CODES) or "spot capacity" in message.lower():
        return EventKind.PROVIDER_CAPACITY_UNAVAILABLE
    return EventKind.PROVIDER_ERROR


def error_code(exc: BaseException) -> str | None:
    """The ``Code`` of an AWS error answer (botocore's ClientError), read without trusting its shape."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    code = error.get("Code") if isinstance(error, dict) else None
    return str(code)[:100] if code else None
