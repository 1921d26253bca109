"""The controller with the AWS provider: settings, the factory, polling, evictions without notice, events in the log."""

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
from controller.providers.aws import AwsAutoScalingProvider
from controller.providers.aws_config import AwsSettings
from controller.providers.base import ProviderInbox
from controller.shell.runner import Runner
from morphing.errors import UserInputError
from tests.aws.fake_aws import MotoServer
from tests.aws.harness import Clock, harness, settle
from tests.controller.helpers import REPO, spec, write_profile

pytestmark = pytest.mark.xdist_group("moto")  # the worker whose moto is warm (make test: --dist loadgroup)
AWS = {"region": "eu-west-1", "auto_scaling_group": "spotmorph-spot", "slots_per_instance": 4}


def test_settings_choose_the_provider(tmp_path: Path) -> None:
    settings = ControllerSettings(state_dir=tmp_path, provider="aws", aws=AWS)  # type: ignore[arg-type]
    assert settings.aws is not None and settings.aws.agent_tokens and settings.aws.poll_seconds == 15
    with pytest.raises(ValueError, match="not an AWS region"):
        ControllerSettings(provider="aws", aws={**AWS, "region": "Europe"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_capacity 1 < min_capacity 2"):
        ControllerSettings(provider="aws", aws={**AWS, "min_capacity": 2, "max_capacity": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="AutoScalingGroupName"):
        ControllerSettings(provider="aws", aws={**AWS, "auto_scaling_group": "a group"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="http"):
        ControllerSettings(provider="aws", aws={**AWS, "endpoint_url": "ftp://x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ControllerSettings(provider="aws", aws={**AWS, "zone": "a"})  # type: ignore[arg-type]
    inbox = ProviderInbox(Clock())
    with pytest.raises(UserInputError, match="aws:"):
        make_provider(ControllerSettings(state_dir=tmp_path, provider="aws"), inbox, Clock(), "127.0.0.1:1")


def test_the_controller_builds_and_closes_the_aws_provider_and_its_poll_timer(tmp_path: Path) -> None:
    async def main() -> None:
        settings = ControllerSettings(state_dir=tmp_path, listen="127.0.0.1:0", provider="aws", aws=AWS)  # type: ignore[arg-type]
        controller = Controller(settings)
        provider = controller.runner.provider
        assert isinstance(provider, AwsAutoScalingProvider) and provider.tokens is not None
        assert provider.port is controller.runner.inbox  # reports go to the runner's inbox, nothing else
        assert controller.timers.config.provider_poll_seconds == 15.0
        assert provider.tokens.vm_token("i-0123456789abcdef0") == controller.tokens.vm_token("i-0123456789abcdef0")
        await controller.stop(grace=0)

    asyncio.run(main())


def test_evictions_without_notice_make_nodes_gone_and_a_queued_job_grows_the_group(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with harness(moto_server, tmp_path / "aws") as h:
            names = h.fake.add(3)
            store = Store(tmp_path / "state.db")
            inbox = ProviderInbox(h.clock)
            provider = h.provider(inbox, min_capacity=3, max_capacity=5)
            runner = Runner(store, h.clock, Config(), provider, inbox)
            for name in names:  # agents register under their instance ids
                await runner.decide(_register(name))
            await runner.poll_provider()
            assert all(runner.nodes[n].state is NodeState.JOINING for n in names)
            h.fake.evict(names[0])  # a Spot interruption nobody reported: the list tells
            await runner.poll_provider()
            assert runner.nodes[names[0]].state is NodeState.GONE
            await runner.submit(spec(min_gpus=5, profile=str(write_profile(tmp_path))))
            await runner.settle()
            assert provider.wanted_slots == 5
            await runner.poll_provider()
            await settle(provider)
            assert len(h.fake.names()) == 5 and h.fake.describe()["DesiredCapacity"] == 5
            h.fake.throttle(100)
            await runner.poll_provider()  # throttled: an event, no crash, nothing marked gone
            assert runner.nodes[names[1]].state is not NodeState.GONE
            kinds = [e.kind for e in store.events()]
            assert "ProviderScaleOut" in kinds and kinds[-1] == "ProviderThrottled"
            await runner.close()
            store.close()

    asyncio.run(scenario())


def _register(name: str) -> Callable[[World, float], list[Command]]:
    return lambda world, now: agents.register(world, name, 1, "10.0.0.5", now)[1]


def test_every_aws_setting_is_described_and_in_docs_aws_md() -> None:
    docs = (REPO / "docs" / "aws.md").read_text()
    for name, field in AwsSettings.model_fields.items():
        assert field.description, f"AwsSettings.{name} has no docstring"
        assert f"| `aws.{name}` |" in docs, f"docs/aws.md does not list the setting `aws.{name}`"
