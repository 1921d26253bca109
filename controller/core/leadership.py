"""Who leads: the lease that fences two controllers sharing one database, and each controller's role, as data.

A lease row says who holds it (one controller process), where it answers, its epoch and when it expires in
the database's clock. A controller takes a lease that is missing, expired or released, at the next epoch;
the holder renews it before it expires. The epoch is a fencing token: every transaction of the leader
checks it (controller.persistence.leases), every reply to an agent carries it, and an agent refuses an
older one. The holder steps down on its own clock before the lease can expire in the database's: it
measures from before it asked for the renewal, which the database dated later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

LEASE = "controller"  # the lease's row name: one leader per database


@dataclass(frozen=True)
class Lease:
    holder: str
    address: str
    epoch: int
    expires_at: float  # the database's clock, Unix seconds; 0: released

    def live(self, now: float) -> bool:
        return now < self.expires_at


def claim(current: Lease | None, holder: str, address: str, now: float, seconds: float, force: bool) -> Lease | None:
    """The lease ``holder`` takes at ``now``, or None while another holds it.

    ``force``: the caller knows no other controller can hold it (SQLite: the state directory's lock is
    exclusive, so a live lease is a dead process's, and a restart need not wait for it to run out).
    """
    if current is None:
        return Lease(holder, address, 1, now + seconds)
    if current.holder == holder:
        return Lease(holder, address, current.epoch, now + seconds)
    if current.live(now) and not force:
        return None
    return Lease(holder, address, current.epoch + 1, now + seconds)


def renewed(current: Lease | None, mine: Lease, now: float, seconds: float) -> Lease | None:
    """``mine`` extended to ``now + seconds``; None when it is no longer ours (deposed: step down)."""
    if current is None or current.holder != mine.holder or current.epoch != mine.epoch:
        return None
    return Lease(mine.holder, mine.address, mine.epoch, now + seconds)


def step_down_at(asked_at: float, seconds: float, margin: float) -> float:
    """When a holder whose last renewal it asked for at ``asked_at`` (its own clock) must stop leading:
    ``margin`` before the lease can run out in the database's clock."""
    return asked_at + seconds - margin


class ControllerRole(StrEnum):
    STARTING = "STARTING"  # not yet asked the database
    STANDBY = "STANDBY"  # another holds the lease: answer reads, refuse writes naming the leader
    LEADING = "LEADING"  # holds the lease: decides, writes, talks to agents and the provider
    STOPPED = "STOPPED"


class RoleCause(StrEnum):
    LEASE_TAKEN = "lease_taken"
    LEASE_HELD_ELSEWHERE = "lease_held_elsewhere"
    DEPOSED = "deposed"
    RENEWAL_OVERDUE = "renewal_overdue"
    STOPPED = "stopped"


R = ControllerRole
C = RoleCause
ROLE_TRANSITIONS: Mapping[tuple[ControllerRole, ControllerRole], frozenset[RoleCause]] = {
    (R.STARTING, R.LEADING): frozenset({C.LEASE_TAKEN}),  # no lease, an expired one, or SQLite's own
    (R.STARTING, R.STANDBY): frozenset({C.LEASE_HELD_ELSEWHERE}),  # another controller's lease is live
    (R.STANDBY, R.LEADING): frozenset({C.LEASE_TAKEN}),  # the leader's lease ran out or was released
    # A write or renewal found another epoch (a standby took over while this one was paused or cut off), or
    # no renewal succeeded in time (the database is unreachable): stop deciding before another can start.
    (R.LEADING, R.STANDBY): frozenset({C.DEPOSED, C.RENEWAL_OVERDUE}),
    (R.STARTING, R.STOPPED): frozenset({C.STOPPED}),
    (R.STANDBY, R.STOPPED): frozenset({C.STOPPED}),
    (R.LEADING, R.STOPPED): frozenset({C.STOPPED}),  # SIGTERM: the lease is released for a standby to take
}


class IllegalRoleChange(ValueError):
    pass


@dataclass(frozen=True)
class RoleChange:
    source: ControllerRole
    target: ControllerRole
    cause: RoleCause
    at: float
    epoch: int


def change_role(source: ControllerRole, target: ControllerRole, cause: RoleCause, at: float, epoch: int) -> RoleChange:
    """The one way a controller's role changes: refused unless the table has the edge for this cause."""
    if cause not in ROLE_TRANSITIONS.get((source, target), frozenset()):
        raise IllegalRoleChange(f"{source} -> {target} ({cause}) is not a controller role change")
    return RoleChange(source, target, cause, at, epoch)
