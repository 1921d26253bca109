"""Where VMs come from: one interface for every provider, the port they report through, and fakes.

Instance ids are node names: an agent registers under the name its provider gave it. A provider never
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


class Clock(Protocol):
    def now(self) -> float: ...


class CannotList(Exception):
    """No instance list this time (a static cluster never has one; Azure unreachable or throttled).

    The runner then skips the poll: a stale or missing list would make nodes that exist look GONE.
    """


class Provider(Protocol):
    async def list_instances(self) -> frozenset[str]:
        """Names of the instances that exist now (a node missing here is GONE); raises CannotList."""
        ...

    async def request_capacity(self, slots: int) -> None:
        """The controller wants ``slots`` slots (GPUs) in all: those its jobs hold plus what queued jobs need.

        A level, not an increment, so asking twice for the same number changes nothing and a restarted
        controller simply asks again. The provider may keep more (its own floor) or give fewer (its
        ceiling); new instances show up later by registering.
        """
        ...

    async def release(self, name: str) -> None:
        """Give back an instance the controller no longer needs (gone, lost)."""
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


class StaticProvider:
    """No provider at all: nodes come and go only through their agents; polling never removes any."""

    def __init__(self) -> None:
        self.released: list[str] = []

    async def list_instances(self) -> frozenset[str]:
        raise CannotList("a static cluster has no instance list")

    async def request_capacity(self, slots: int) -> None:
        return None  # nobody to ask: the operator adds nodes

    async def release(self, name: str) -> None:
        self.released.append(name)

    async def close(self) -> None:
        return None
