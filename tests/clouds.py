"""What the cloud providers' test harnesses (tests/azure, tests/aws, tests/gcp, tests/providers) share: an
injected clock, the provider port that records, waiting for a provider's background operations, and the guard
that keeps every test offline. What differs (each cloud's fake, settings and provider) stays in its harness."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pytest

from controller.eventlog.fact import Fact
from controller.hosts import is_loopback_host


@dataclass
class Clock:
    t: float = 1_000_000.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass(kw_only=True)
class RecordingPort:
    """The provider port of a harness: events recorded, busy nodes set by tests, the provider's waits (retries,
    operation polls) recorded, not slept."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    busy_nodes: set[str] = field(default_factory=set)
    slept: list[float] = field(default_factory=list)

    def report(self, fact: Fact) -> None:
        self.events.append((str(fact.kind), fact.data()))

    def busy(self, name: str) -> bool:
        return name in self.busy_nodes

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0)


@runtime_checkable
class Operating(Protocol):
    @property
    def pending(self) -> dict[str, asyncio.Task[None]]: ...


async def settle(provider: Operating) -> None:
    """Wait for the provider's background operations (the fakes end each after a few polls)."""
    while provider.pending:
        await asyncio.gather(*provider.pending.values(), return_exceptions=True)


def _loopback(address: Any) -> bool:
    return not isinstance(address, tuple) or is_loopback_host(str(address[0]))  # not a tuple: AF_UNIX


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No socket beyond loopback: a test that tries fails naming the address (each cloud's conftest uses it)."""
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(self: socket.socket, address: Any) -> None:
        if not _loopback(address):
            raise AssertionError(f"a test tried to reach {address} (beyond loopback)")
        connect(self, address)

    def guarded_ex(self: socket.socket, address: Any) -> int:
        if not _loopback(address):
            raise AssertionError(f"a test tried to reach {address} (beyond loopback)")
        return connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded_ex)
    yield
