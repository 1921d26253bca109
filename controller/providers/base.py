"""Where VMs come from: one interface for every provider, the port they report through, and fakes.

Instance ids are node names: an agent registers under the name its provider gave it. Capacity comes in pools
(:class:`scheduler.pools.PoolKind`): spot, which the cloud may take back at any time, and on-demand, which costs
more and stays; a provider is asked for a level of each, lists each instance with its pool, and releases an
instance from whichever pool it is in. A provider without an on-demand pool refuses a level above zero
(:class:`PoolNotConfigured`). A provider never
reaches into the runner: it reports what it did (and what went wrong) through a :class:`ProviderPort`,
whose events the runner drains under its lock into the event log, and asks the same port whether a
node runs a job, answered from a snapshot the runner publishes after every commit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.core.events import EventKind
from controller.eventlog.fact import Fact
from scheduler.pools import PoolKind


class Clock(Protocol):
    def now(self) -> float: ...


class CannotList(Exception):
    """No instance list this time (a static cluster never has one; Azure unreachable or throttled).

    The runner then skips the poll: a stale or missing list would make nodes that exist look GONE.
    """


class PoolNotConfigured(Exception):
    """Capacity of a pool this provider has none of was asked for (on-demand, with no on-demand group set up)."""


class Provider(Protocol):
    async def list_pools(self) -> Mapping[str, PoolKind]:
        """The instances that exist now, each with its pool (a node missing here is GONE); raises CannotList.

        One list for every pool: where one pool cannot be listed, none is (a partial list would make the
        other pool's nodes look GONE)."""
        ...

    async def list_instances(self) -> frozenset[str]:
        """Names of the instances that exist now, of every pool: the keys of :meth:`list_pools`."""
        ...

    async def request_capacity(self, slots: int, pool: PoolKind = PoolKind.SPOT) -> None:
        """The controller wants ``slots`` slots (GPUs) of ``pool``: for spot, those its jobs hold plus what queued
        jobs need; for on-demand, what its policy decided to pay for. Each pool's level is its own.

        A level, not an increment, so asking twice for the same number changes nothing and a restarted
        controller simply asks again (for each pool). The provider may keep more (its own floor) or give fewer
        (its ceiling); new instances show up later by registering. A level above zero for a pool the provider
        has none of raises :class:`PoolNotConfigured`, naming the setting that adds it.
        """
        ...

    async def release(self, name: str) -> None:
        """Give back an instance the controller no longer needs (gone, lost; on-demand when spot returns),
        from whichever pool :meth:`list_pools` said it is in."""
        ...

    async def close(self) -> None:
        """Stop background work and close connections; the controller is shutting down."""
        ...


def instances_for(slots: int, slots_per_instance: int) -> int:
    """Instances of ``slots_per_instance`` slots each that give at least ``slots`` slots."""
    return math.ceil(max(0, slots) / slots_per_instance)


@dataclass(frozen=True)
class ProviderEvent:
    """Something a provider did or ran into, for the event log (``ProviderScaleOut``, ``ProviderThrottled``, ...)."""

    kind: EventKind
    at: float
    data: Mapping[str, Any] = field(default_factory=dict)


class ProviderPort(Protocol):
    """All a provider may ask of the controller: record an event (:mod:`controller.eventlog.provider_facts`),
    and whether a node runs a job."""

    def report(self, fact: Fact) -> None: ...

    def busy(self, name: str) -> bool: ...


class SilentPort:
    """The port of a provider nobody listens to (the ``spotmorph local`` commands, one-off tools)."""

    def report(self, fact: Fact) -> None:
        return None

    def busy(self, name: str) -> bool:
        return False


class ProviderInbox:
    """The :class:`ProviderPort` the runner owns: events wait here until it drains them under its lock.

    Reports are stamped when they happen (not when drained), and ``busy`` answers from the frozen set
    the runner last published, so a provider's background task never sees a half-applied decision.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._events: list[ProviderEvent] = []
        self._busy: frozenset[str] = frozenset()

    def report(self, fact: Fact) -> None:
        self._events.append(ProviderEvent(fact.kind, self.clock.now(), fact.data()))

    def busy(self, name: str) -> bool:
        return name in self._busy

    def publish_busy(self, names: frozenset[str]) -> None:
        self._busy = names

    def drain(self) -> list[ProviderEvent]:
        events, self._events = self._events, []
        return events


def refuse_pool(pool: PoolKind, slots: int, fix: str) -> None:
    """Raise :class:`PoolNotConfigured` for a level above zero of a pool there is none of; ``fix``: how to add it.

    Level zero is always granted: a controller may say "no on-demand" to any provider."""
    if slots > 0:
        raise PoolNotConfigured(f"{slots} {pool} slot(s) asked for, but this provider has no {pool} pool: {fix}")


class StaticProvider:
    """No provider at all: nodes come and go only through their agents; polling never removes any."""

    def __init__(self) -> None:
        self.released: list[str] = []

    async def list_pools(self) -> Mapping[str, PoolKind]:
        raise CannotList("a static cluster has no instance list")

    async def list_instances(self) -> frozenset[str]:
        raise CannotList("a static cluster has no instance list")

    async def request_capacity(self, slots: int, pool: PoolKind = PoolKind.SPOT) -> None:
        if pool is PoolKind.ON_DEMAND:
            refuse_pool(pool, slots, "a static cluster's nodes are the operator's (provider: azure, aws, gcp or local)")
        return None  # nobody to ask: the operator adds nodes

    async def release(self, name: str) -> None:
        self.released.append(name)

    async def close(self) -> None:
        return None
