"""Where VMs come from: one interface for every provider, and a fake for tests.

The local-process provider arrives with the worker agent, Azure scale sets with their own issue.
Instance ids are node names for now: an agent registers under the name its provider gave it.
"""

from __future__ import annotations

from typing import Protocol


class Provider(Protocol):
    async def list_instances(self) -> frozenset[str]:
        """Names of the instances that exist now (a node missing here is GONE)."""
        ...

    async def request_capacity(self, count: int) -> None:
        """Ask for ``count`` more instances; they show up later by registering."""
        ...

    async def release(self, name: str) -> None:
        """Give back an instance the controller no longer needs (gone, lost)."""
        ...


class StaticProvider:
    """No provider at all: nodes come and go only through their agents; polling never removes any."""

    def __init__(self) -> None:
        self.released: list[str] = []

    async def list_instances(self) -> frozenset[str]:
        raise NotImplementedError("a static cluster has no instance list")

    async def request_capacity(self, count: int) -> None:
        return None

    async def release(self, name: str) -> None:
        self.released.append(name)


class FakeProvider:
    """An in-memory provider for tests: instances are added and removed by the test."""

    def __init__(self, instances: frozenset[str] = frozenset()) -> None:
        self.instances = set(instances)
        self.requested = 0
        self.released: list[str] = []

    async def list_instances(self) -> frozenset[str]:
        return frozenset(self.instances)

    async def request_capacity(self, count: int) -> None:
        self.requested += count

    async def release(self, name: str) -> None:
        self.released.append(name)
        self.instances.discard(name)
