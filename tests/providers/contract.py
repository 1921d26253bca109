"""What every cloud provider must do, whichever cloud: the contract suite's interface (tests in test_contract.py).

A provider joins the suite with an async context manager factory, ``Factory = (Options) -> Subject`` (in
tests/providers/NAME_subject.py), a fixture returning it in tests/providers/conftest.py (a fixture, so that it
can use session fixtures such as a fake cloud's server), and one line in ``SUBJECTS`` of test_contract.py
naming that fixture. The factory builds the provider on a fake of
its cloud, empty at the start, configured as ``Options`` says, reporting to ``subject.port`` and reading the
time from ``subject.clock``; on exit it closes the provider and the fake.

The cloud handle (:class:`Cloud`) inspects and perturbs the fake:

- ``names()``: the instances of the groups (scale sets, managed instance groups; spot and on-demand) that exist
  and are not on their way out: what ``list_instances`` must answer once the provider has caught up;
- ``mutations()``: how many requests that change the cloud the fake received so far (idempotence);
- ``requests()``: how many requests of any kind (nothing is sent while backing off);
- ``evict(name)``: the cloud takes that instance away (a Spot interruption), as it would;
- ``throttle(n)``: the next ``n`` API requests are answered with the cloud's throttling error;
- ``unreachable(on)``: while on, connections to the API are refused;
- ``stall(on)``: while on, requests (or operations) that change the cloud do not end.

The behaviours (each a test of test_contract.py): ``request_capacity`` is a level in slots (instances =
ceil(slots / slots_per_instance), within 0 and ``max_instances``) that the provider reaches over a few polls
(``list_instances`` then ``settle``), up and down; asking again for the same level, or a restarted provider
asking for it, changes nothing; a level above the ceiling is said once (ProviderCapacityLimited); a released
instance is not listed again; a busy node's instance is never released (ProviderReleaseRefused); an evicted
instance is not listed and is replaced; an unreachable API makes ``list_instances`` raise ``CannotList`` and
says ProviderUnreachable; a throttled request is retried (a throttling shorter than the retries is not even
seen), a longer one says ProviderThrottled once, raises ``CannotList`` and sends nothing until the backoff
(``throttle_backoff_seconds`` at most) has passed; ``close`` ends the background work promptly, even stalled.
Pools (``Options.on_demand_instances`` > 0 adds an on-demand group): each pool's level is its own, reached and
kept alike (asking again, or after a restart, changes nothing); ``list_pools`` names each instance's pool; a
release takes the instance from its own pool; without an on-demand group, a level above zero of on-demand is
refused (``PoolNotConfigured``, naming the setting) and level zero is granted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

from controller.eventlog.fact import Fact
from controller.providers.base import Provider
from tests import clouds
from tests.clouds import Clock

__all__ = ["Clock", "Cloud", "Factory", "Options", "Port", "Subject", "converge", "pending", "settle"]


class Cloud(Protocol):
    def names(self) -> frozenset[str]: ...

    def mutations(self) -> int: ...

    def requests(self) -> int: ...

    def evict(self, name: str) -> None: ...

    def throttle(self, requests: int) -> None: ...

    def unreachable(self, on: bool) -> None: ...

    def stall(self, on: bool) -> None: ...


@dataclass(frozen=True)
class Options:
    """How the suite wants the provider configured (each factory maps these to its settings)."""

    slots_per_instance: int = 2
    max_instances: int = 4  # the provider's ceiling; its floor is 0
    retries: int = 2  # retries of a throttled or failed call, their waits not slept (injected)
    throttle_backoff_seconds: float = 600.0  # the most a throttled provider may wait before it calls again
    on_demand_instances: int = 0  # > 0: an on-demand group (floor 0) beside the spot one, with this ceiling


@dataclass
class Port:
    """The provider port: event kinds recorded, busy nodes set by the test."""

    kinds: list[str] = field(default_factory=list)
    busy_nodes: set[str] = field(default_factory=set)

    def report(self, fact: Fact) -> None:
        self.kinds.append(str(fact.kind))

    def busy(self, name: str) -> bool:
        return name in self.busy_nodes


@dataclass
class Subject:
    provider: Provider
    cloud: Cloud
    port: Port
    clock: Clock
    settle: Callable[[Provider], Awaitable[None]]  # wait until that provider's background operations ended
    pending: Callable[[Provider], int]  # how many background operations that provider still runs
    restart: Callable[[], Provider]  # another provider on the same cloud (a restarted controller); closed on exit


Factory = Callable[[Options], AbstractAsyncContextManager[Subject]]


async def converge(subject: Subject, provider: Provider | None = None, polls: int = 4) -> frozenset[str]:
    """Poll (list, then let background work end) a few times, as the controller's timer would; the last list."""
    provider = provider or subject.provider
    for _ in range(polls):
        await provider.list_instances()
        await subject.settle(provider)
    return await provider.list_instances()


async def settle(provider: Provider) -> None:
    """Wait until a cloud provider's background operations ended (a Subject's ``settle``)."""
    await clouds.settle(_operating(provider))


def pending(provider: Provider) -> int:
    """How many background operations a cloud provider still runs (a Subject's ``pending``)."""
    return len(_operating(provider).pending)


def _operating(provider: Provider) -> clouds.Operating:
    assert isinstance(provider, clouds.Operating), f"{type(provider).__name__} keeps no pending operations"
    return provider
