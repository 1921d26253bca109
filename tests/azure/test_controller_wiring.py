"""The controller with the Azure provider: settings, polling, evictions without notice, events in the log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from controller.app.daemon import Controller
from controller.app.providers import make_provider
from controller.app.settings import ControllerSettings
from controller.core import intake as agents
from controller.core.lifecycle import NodeState
from controller.core.model import Command, World
from controller.core.reconcile import Config
from controller.persistence.store import Store
from controller.providers.azure import AzureScaleSetProvider
from controller.providers.base import ProviderInbox, StaticProvider
from controller.shell.runner import Runner
from morphing.errors import UserInputError
from tests.azure.harness import SUBSCRIPTION, Clock, harness, settle
from tests.controller.helpers import spec, write_profile

AZURE = {"subscription_id": SUBSCRIPTION, "resource_group": "rg", "scale_set": "spot", "target_capacity": 2}


def test_settings_choose_the_provider(tmp_path: Path) -> None:
    settings = ControllerSettings(state_dir=tmp_path, provider="azure", azure=AZURE)  # type: ignore[arg-type]
    assert settings.azure is not None and settings.azure.orchestration_mode == "Flexible"
    with pytest.raises(ValueError, match="subscription id"):
        ControllerSettings(provider="azure", azure={**AZURE, "subscription_id": "mine"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_capacity 1 < target_capacity 2"):
        ControllerSettings(provider="azure", azure={**AZURE, "max_capacity": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ControllerSettings(provider="ibm")  # type: ignore[arg-type]
    inbox = ProviderInbox(Clock())
    with pytest.raises(UserInputError, match="azure:"):
        make_provider(ControllerSettings(state_dir=tmp_path, provider="azure"), inbox, Clock(), "127.0.0.1:1")
    static = make_provider(ControllerSettings(state_dir=tmp_path), inbox, Clock(), "127.0.0.1:1")
    assert isinstance(static.provider, StaticProvider) and static.poll_seconds == 0


def test_the_controller_builds_and_closes_the_azure_provider_and_its_poll_timer(tmp_path: Path) -> None:
    async def main() -> None:
        settings = ControllerSettings(state_dir=tmp_path, listen="127.0.0.1:0", provider="azure", azure=AZURE)  # type: ignore[arg-type]
        controller = Controller(settings)
        provider = controller.runner.provider
        assert isinstance(provider, AzureScaleSetProvider)
        assert provider.port is controller.runner.inbox  # reports go to the runner's inbox, nothing else
        assert controller.timers.config.provider_poll_seconds == 15.0
        await controller.stop(grace=0)

    asyncio.run(main())


def test_evictions_without_notice_make_nodes_gone_and_errors_are_events(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path / "arm") as h:
            names = h.fake.add_running(4)
            store = Store(tmp_path / "state.db")
            inbox = ProviderInbox(h.clock)
            provider = h.provider(inbox, target_capacity=4)
            runner = Runner(store, h.clock, Config(), provider, inbox)
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
            assert "ProviderScaleOut" in kinds and kinds[-1] == "ProviderThrottled"
            await runner.close()
            store.close()

    asyncio.run(scenario())


def test_a_queued_job_grows_the_scale_set_up_to_max_capacity_and_back(tmp_path: Path) -> None:
    """The runner asks for busy plus queued slots; the provider scales to it within target and max."""

    async def scenario() -> None:
        async with harness(tmp_path / "arm") as h:
            store = Store(tmp_path / "state.db")
            inbox = ProviderInbox(h.clock)
            provider = h.provider(inbox, target_capacity=1, max_capacity=5)
            runner = Runner(store, h.clock, Config(), provider, inbox)
            job = await runner.submit(spec(min_gpus=3, profile=str(write_profile(tmp_path))))
            await runner.settle()
            assert provider.wanted_slots == 3 and provider.desired == 3
            await runner.poll_provider()
            await settle(provider)
            assert h.fake.capacity == 3  # not the floor of 1: what the queued job needs
            await runner.cancel(job.id, "test")
            await runner.settle()
            assert provider.desired == 1
            await runner.poll_provider()
            await settle(provider)
            assert h.fake.capacity == 1 and len(h.fake.running()) == 1  # idle instances scaled back in
            await runner.submit(spec(min_gpus=9, profile=str(write_profile(tmp_path)), checkpoint_dir="/tmp/c2"))
            await runner.settle()
            await runner.tick()
            kinds = [e.kind for e in store.events()]
            assert kinds.count("CapacityRequested") == 3 and "ProviderCapacityLimited" in kinds
            await runner.close()
            store.close()

    asyncio.run(scenario())


def _register(name: str) -> Callable[[World, float], list[Command]]:
    return lambda world, now: agents.register(world, name, 1, "10.0.0.5", now)[1]
