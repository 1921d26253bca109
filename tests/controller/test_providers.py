"""The local-process provider asked for capacity, and the provider factory's choices (no runner, no daemon)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.app.providers import make_provider
from controller.app.settings import ControllerSettings, LocalSettings
from controller.core.events import EventKind
from controller.eventlog import provider_facts
from controller.eventlog.fact import Fact
from controller.providers.base import CannotList, ProviderInbox, StaticProvider
from morphing.errors import UserInputError
from spotmorph.commands.controller import PROVIDERS
from spotmorph.local.provider import LocalProcessProvider, kill_vm

SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")  # an "agent" that never registers


class Clock:
    def now(self) -> float:
        return 7.0


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def report(self, fact: Fact) -> None:
        self.events.append((str(fact.kind), fact.data()))

    def busy(self, name: str) -> bool:
        return False


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[LocalProcessProvider, Recorder]]:
    port = Recorder()
    provider = LocalProcessProvider(tmp_path, "127.0.0.1:1", 2, command=SLEEPER, max_nodes=3, port=port)
    try:
        yield provider, port
    finally:
        for vm in provider.vms():
            kill_vm(vm)


def test_local_capacity_counts_booting_agents_and_stops_at_max_nodes(
    local: tuple[LocalProcessProvider, Recorder],
) -> None:
    provider, port = local

    def alive() -> int:
        return sum(vm.alive() for vm in provider.vms())

    asyncio.run(provider.request_capacity(3))  # 2 slots an agent: 2 agents
    assert alive() == 2 and port.events == [
        ("LocalVmsStarted", {"vms": ["vm-1", "vm-2"], "slots": 2, "message": "vm-1, vm-2"})
    ]
    asyncio.run(provider.request_capacity(4))  # the booting ones count: nothing more
    assert alive() == 2 and len(port.events) == 1
    asyncio.run(provider.request_capacity(100))
    assert alive() == 3  # max_nodes
    assert asyncio.run(provider.list_instances()) == frozenset()  # none registered yet: no node names


def test_local_provider_without_max_nodes_never_starts_agents(tmp_path: Path) -> None:
    provider = LocalProcessProvider(tmp_path, "127.0.0.1:1", command=SLEEPER)
    asyncio.run(provider.request_capacity(5))
    assert provider.vms() == []


def test_the_factory_builds_each_provider_on_the_port_it_is_given(tmp_path: Path) -> None:
    inbox = ProviderInbox(Clock())
    static = make_provider(ControllerSettings(state_dir=tmp_path / "state"), inbox, Clock(), "h:1")
    assert isinstance(static.provider, StaticProvider) and static.poll_seconds == 0
    with pytest.raises(CannotList):
        asyncio.run(static.provider.list_instances())
    local = LocalSettings(poll_seconds=0.5, slots=4, max_nodes=2, imds_url="http://127.0.0.1:9")
    settings = ControllerSettings(state_dir=tmp_path / "state", provider="local", local=local)
    with pytest.raises(UserInputError, match="spotmorph controller"):  # the controller does not hold `local`
        make_provider(settings, inbox, Clock(), "127.0.0.1:4242")
    built = make_provider(settings, inbox, Clock(), "127.0.0.1:4242", PROVIDERS)
    provider = built.provider
    assert isinstance(provider, LocalProcessProvider) and built.poll_seconds == 0.5
    assert (provider.controller, provider.slots, provider.max_nodes) == ("127.0.0.1:4242", 4, 2)
    assert provider.imds_url == "http://127.0.0.1:9" and provider.port is inbox
    assert provider.cluster_dir == tmp_path.resolve() and provider.state_dir == tmp_path / "state"


def test_every_provider_call_failure_has_its_dataclass() -> None:
    """Each kind of call failure describe() gives is a ProviderCallFailed of its own (every kind's fact:
    tests/controller/test_event_schema.py)."""
    failures = {EventKind.PROVIDER_THROTTLED, EventKind.PROVIDER_CAPACITY_UNAVAILABLE, EventKind.PROVIDER_CONFLICT}
    failures |= {EventKind.PROVIDER_NOT_FOUND, EventKind.PROVIDER_AUTH_FAILED, EventKind.PROVIDER_UNREACHABLE}
    assert set(provider_facts.CALL_FAILURES) == failures | {EventKind.PROVIDER_ERROR}  # every kind describe() gives
