"""What the GCP provider does with its managed instance group, decided without the client: pure functions.

:mod:`controller.providers.gcp` lists the group's managed instances, asks :func:`plan` what to do and does
it. The group's size is its ``targetSize``; a resize only ever grows it (shrinking lets the group pick which
VMs die, maybe busy ones): scale-in deletes chosen idle instances by name, which shrinks ``targetSize`` too.

What a managed instance is, for the controller (``instanceStatus`` and ``currentAction``):

- *alive*: listed to the controller (created, being created, running); its node lives;
- *returning*: the group recreates or restarts it under the same name (a preempted Spot VM whose
  termination action is DELETE comes back so): not listed, so its node becomes GONE, but counted in the
  group's size, since the group brings it back itself;
- *stopped*: stopped, terminated or suspended and left so (termination action STOP): not listed, and
  deleted (its place in ``targetSize`` is then filled by a scale-out on a later poll);
- *leaving*: being deleted or abandoned: neither listed nor counted.

Backoff, capacity ceilings and the busy-node rule are every cloud's (:mod:`controller.providers.scaling`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from controller.providers.scaling import CLEAN, SCALE, Backoff

STOPPED_STATUS = frozenset({"STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED", "PENDING_STOP"})
RETURNING_ACTIONS = frozenset({"RECREATING", "RESTARTING"})
LEAVING_ACTIONS = frozenset({"DELETING", "ABANDONING"})
CREATING_ACTIONS = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES"})
# lastAttempt error codes that say the zone or the project has no room (the group keeps trying itself).
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "QUOTA_EXCEEDED",
        "RESOURCE_EXHAUSTED",
        "RESOURCE_POOL_EXHAUSTED",
        "STOCKOUT",
    }
)


@dataclass(frozen=True)
class Managed:
    """One managed instance as listed (names are node names: the agent registers under its VM's name)."""

    name: str
    instance_id: str = ""  # GCE's numeric id; "" until the VM exists
    status: str = ""  # instanceStatus: RUNNING, STOPPED, ...; "" until the VM exists
    action: str = "NONE"  # currentAction: NONE, CREATING, RECREATING, DELETING, ...
    errors: tuple[tuple[str, str], ...] = ()  # lastAttempt's (code, message): why creating it failed so far

    @property
    def leaving(self) -> bool:
        return self.action in LEAVING_ACTIONS

    @property
    def returning(self) -> bool:
        return self.action in RETURNING_ACTIONS and not self.leaving

    @property
    def stopped(self) -> bool:
        return self.status in STOPPED_STATUS and not (self.leaving or self.returning)

    @property
    def alive(self) -> bool:
        return not (self.leaving or self.returning or self.stopped)

    @property
    def running(self) -> bool:
        return self.status == "RUNNING" and self.action == "NONE"

    @property
    def creating(self) -> bool:
        return self.action in CREATING_ACTIONS


@dataclass(frozen=True)
class Plan:
    clean: tuple[Managed, ...] = ()  # stopped instances: delete them
    resize: int | None = None  # grow targetSize to at least this (the shell reads the current one first)
    scale_in: tuple[Managed, ...] = ()  # idle instances above the desired size: delete them
    deferred: int = 0  # instances above the desired size kept because their nodes run jobs


def plan(
    listed: Sequence[Managed],
    desired: int,
    busy: Collection[str],
    *,
    delete_busy: bool,
    pending: Collection[str],
    now: float,
    backoff: Backoff,
) -> Plan:
    """What to start after a list; nothing while backing off or while the same kind of operation runs.

    Stopped instances are deleted first and the group grows on a later poll: deleting shrinks ``targetSize``,
    and a resize decided beside it would count them twice."""
    if not backoff.may_change(now):
        return Plan()
    stopped = tuple(i for i in listed if i.stopped)
    clean = stopped if CLEAN not in pending else ()
    counted = [i for i in listed if i.alive or i.returning]
    if SCALE in pending or len(counted) == desired:
        return Plan(clean)
    if len(counted) < desired:
        return Plan(clean) if stopped or CLEAN in pending else Plan(resize=desired)
    extra = len(counted) - desired
    order = sorted(counted, key=_scale_in_order)
    idle = tuple(i for i in order if delete_busy or not (i.alive and i.name in busy))[:extra]
    return Plan(clean, scale_in=idle, deferred=extra - len(idle))


def _scale_in_order(instance: Managed) -> tuple[int, str]:
    """Those that cost least to lose first: coming back anyway, then not running yet, then running ones."""
    rank = 0 if instance.returning else 1 if not instance.running else 2
    return rank, instance.name


def creation_errors(listed: Sequence[Managed]) -> dict[str, tuple[bool, str]]:
    """Why instances are not being created, by message: (a capacity or quota error?, the message)."""
    found: dict[str, tuple[bool, str]] = {}
    for instance in listed:
        if not instance.creating:
            continue
        for code, message in instance.errors:
            text = f"{code}: {message}" if message else code
            found.setdefault(text, (code in CAPACITY_CODES, text))
    return found
