"""The controller with the GCP provider: settings (each documented), the factory, polling, evictions in the log."""

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
from controller.providers.base import ProviderInbox
from controller.providers.gcp import GcpInstanceGroupProvider
from controller.providers.gcp_config import GcpSettings
from controller.shell.runner import Runner
from morphing.errors import UserInputError
from tests.controller.helpers import REPO, spec, write_profile
from tests.gcp.harness import GROUP, Clock, harness, settle

GCP = {"project": "spotmorph-test", "zone": "us-central1-a", "instance_group": "spot", "target_capacity": 2}


def test_every_gcp_setting_is_described_and_in_docs_gcp_md() -> None:
    docs = (REPO / "docs" / "gcp.md").read_text()
    for name, field in GcpSettings.model_fields.items():
        assert field.description, f"GcpSettings.{name} has no docstring"
        assert f"`{name}`" in docs, f"docs/gcp.md does not mention the setting `{name}`"


def test_settings_choose_the_provider(tmp_path: Path) -> None:
    settings = ControllerSettings(state_dir=tmp_path, provider="gcp", gcp=GCP)  # type: ignore[arg-type]
    assert settings.gcp is not None and settings.gcp.audience == "spotmorph/spotmorph-test/us-central1-a/spot"
    bad = {
        "project": ("My Project", "not a project id"),
        "zone": ("us-central1", "not a zone"),
        "instance_group": ("Spot_Group", "lowercase"),
        "api_endpoint": ("http://compute.example.com", "https://"),
        "identity_certs": ("certs.json", "absolute file path"),
    }
    for field, (value, says) in bad.items():
        with pytest.raises(ValueError, match=says):
            ControllerSettings(provider="gcp", gcp={**GCP, field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_capacity 1 < target_capacity 2"):
        ControllerSettings(provider="gcp", gcp={**GCP, "max_capacity": 1})  # type: ignore[arg-type]
    inbox = ProviderInbox(Clock())
    with pytest.raises(UserInputError, match="gcp:"):
        make_provider(ControllerSettings(state_dir=tmp_path, provider="gcp"), inbox, Clock(), "127.0.0.1:1")


def test_the_controller_builds_and_closes_the_gcp_provider_and_its_poll_timer(tmp_path: Path) -> None:
    async def main() -> None:
        local = {**GCP, "api_endpoint": "http://127.0.0.1:1"}  # a local fake's address: anonymous credentials
        settings = ControllerSettings(state_dir=tmp_path, listen="127.0.0.1:0", provider="gcp", gcp=local)  # type: ignore[arg-type]
        controller = Controller(settings)
        provider = controller.runner.provider
        assert isinstance(provider, GcpInstanceGroupProvider)
        assert provider.port is controller.runner.inbox  # reports go to the runner's inbox, nothing else
        assert controller.timers.config.provider_poll_seconds == 15.0
        await controller.stop(grace=0)

    asyncio.run(main())


def test_preemptions_without_notice_make_nodes_gone_and_errors_are_events(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(running=4) as h:
            names = h.fake.running(GROUP)
            store = Store(tmp_path / "state.db")
            inbox = ProviderInbox(h.clock)
            provider = h.provider(inbox, target_capacity=4)
            runner = Runner(store, h.clock, Config(), provider, inbox)
            for name in names:  # agents register under their instance names
                await runner.decide(_register(name))
            await runner.poll_provider()
            assert all(runner.nodes[n].state is not NodeState.GONE for n in names)
            h.fake.preempt(names[0])  # recreated by the group under its name
            h.fake.preempt(names[1], action="STOP")
            await runner.poll_provider()  # nobody reported a notice: the list tells
            assert [runner.nodes[n].state for n in names] == [NodeState.GONE] * 2 + [NodeState.JOINING] * 2
            await settle(provider)
            h.fake.throttle(100)
            await runner.poll_provider()  # throttled: an event, no crash, nothing marked gone
            assert runner.nodes[names[2]].state is NodeState.JOINING
            kinds = [e.kind for e in store.events()]
            assert "ProviderDeleteInstances" in kinds and kinds[-1] == "ProviderThrottled"
            await runner.close()
            store.close()

    asyncio.run(scenario())


def test_a_queued_job_grows_the_group_up_to_max_capacity_and_back(tmp_path: Path) -> None:
    """The runner asks for busy plus queued slots; the provider sizes the group to it within target and max."""

    async def scenario() -> None:
        async with harness() as h:
            store = Store(tmp_path / "state.db")
            inbox = ProviderInbox(h.clock)
            provider = h.provider(inbox, target_capacity=1, max_capacity=5)
            runner = Runner(store, h.clock, Config(), provider, inbox)
            job = await runner.submit(spec(min_gpus=3, profile=str(write_profile(tmp_path))))
            await runner.settle()
            assert provider.wanted_slots == 3 and provider.desired == 3
            await runner.poll_provider()
            await settle(provider)
            assert h.fake.groups[GROUP].target_size == 3  # not the floor of 1: what the queued job needs
            await runner.cancel(job.id, "test")
            await runner.settle()
            await runner.poll_provider()
            await settle(provider)
            assert h.fake.groups[GROUP].target_size == 1 and len(h.fake.running(GROUP)) == 1
            await runner.close()
            store.close()

    asyncio.run(scenario())


def _register(name: str) -> Callable[[World, float], list[Command]]:
    return lambda world, now: agents.register(world, name, 1, "10.0.0.5", now)[1]
