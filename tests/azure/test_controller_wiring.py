"""The controller with the Azure provider: settings, polling, evictions without notice, events in the log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.app.daemon import Controller, ControllerSettings
from controller.app.providers import make_provider
from controller.core import intake as agents
from controller.core.lifecycle import NodeState
from controller.core.model import Command, RecordEvent, World
from controller.core.reconcile import Config
from controller.persistence.store import Store
from controller.providers.azure import AzureScaleSetProvider
from controller.shell.runner import Runner
from morphing.errors import UserInputError
from tests.azure.harness import SUBSCRIPTION, harness, settle

AZURE = {"subscription_id": SUBSCRIPTION, "resource_group": "rg", "scale_set": "spot", "target_capacity": 2}


def test_settings_choose_the_provider(tmp_path: Path) -> None:
    settings = ControllerSettings(state_dir=tmp_path, provider="azure", azure=AZURE)  # type: ignore[arg-type]
    assert settings.azure is not None and settings.azure.orchestration_mode == "Flexible"
    with pytest.raises(ValueError, match="subscription id"):
        ControllerSettings(provider="azure", azure={**AZURE, "subscription_id": "mine"})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ControllerSettings(provider="gcp")  # type: ignore[arg-type]
    runner = Runner(Store(tmp_path / "state.db"), _Clock(), Config(), _Unused())
    with pytest.raises(UserInputError, match="azure:"):
        make_provider(ControllerSettings(state_dir=tmp_path, provider="azure"), runner, "127.0.0.1:1")
    assert make_provider(ControllerSettings(state_dir=tmp_path), runner, "127.0.0.1:1")[1] == 0


def test_the_controller_builds_and_closes_the_azure_provider_and_its_poll_timer(tmp_path: Path) -> None:
    async def main() -> None:
        settings = ControllerSettings(state_dir=tmp_path, listen="127.0.0.1:0", provider="azure", azure=AZURE)  # type: ignore[arg-type]
        controller = Controller(settings)
        assert isinstance(controller.runner.provider, AzureScaleSetProvider)
        assert controller.timers.config.provider_poll_seconds == 15.0
        await controller.stop(grace=0)

    asyncio.run(main())


def test_evictions_without_notice_make_nodes_gone_and_errors_are_events(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path / "arm") as h:
            names = h.fake.add_running(4)
            store = Store(tmp_path / "state.db")
            runner = Runner(store, h.clock, Config(), _Unused())
            provider = h.provider(target_capacity=4)
            provider.emit = lambda kind, data: runner.commit([RecordEvent(kind, h.clock.now(), None, None, data)])
            runner.provider = provider
            for name in names:  # agents register under their VM names
                await runner.decide(_register(name))
            await runner.poll_provider()
            assert all(runner.nodes[n].state is not NodeState.GONE for n in names)
            ids = [provider.instances[n].instance_id for n in names[:2]]
            for i in ids:
                await provider.client.virtual_machine_scale_set_vms.simulate_eviction("spotmorph-rg", "spot", i)
            await runner.poll_provider()  # nobody reported a notice: the list tells
            assert [runner.nodes[n].state for n in names] == [NodeState.GONE] * 2 + [NodeState.JOINING] * 2
            await settle(provider)
            h.fake.throttle(100, retry_after=60)
            await runner.poll_provider()  # throttled: an event, no crash, nothing marked gone
            assert runner.nodes[names[2]].state is NodeState.JOINING
            kinds = [e.kind for e in store.events()]
            assert "AzureScaleOut" in kinds and kinds[-1] == "AzureThrottled"
            store.close()

    asyncio.run(scenario())


def _register(name: str) -> Callable[[World, float], list[Command]]:
    return lambda world, now: agents.register(world, name, 1, "10.0.0.5", now)[1]


class _Clock:
    def now(self) -> float:
        return 1000.0


class _Unused:
    async def list_instances(self) -> frozenset[str]:
        raise NotImplementedError

    async def request_capacity(self, count: int) -> None:
        return None

    async def release(self, name: str) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)
