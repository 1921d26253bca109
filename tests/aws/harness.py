"""The AWS provider on real boto3 against moto behind the test's front: clock, session, retries' waits, events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]

from controller.providers.aws import AwsAutoScalingProvider
from controller.providers.aws_config import AwsSettings
from controller.providers.base import ProviderPort
from tests.aws.fake_aws import CREDENTIALS, REGION, FakeAws, MotoServer
from tests.clouds import Clock, RecordingPort, settle

__all__ = ["Clock", "Harness", "harness", "run", "settle"]


@dataclass
class Harness(RecordingPort):
    """The fake, an injected clock, and the provider port (events recorded, busy nodes set by tests, the provider's
    waits between retries recorded, not slept)."""

    fake: FakeAws
    clock: Clock = field(default_factory=Clock)
    providers: list[AwsAutoScalingProvider] = field(default_factory=list)

    def settings(self, **overrides: Any) -> AwsSettings:
        values: dict[str, Any] = {
            "region": REGION,
            "auto_scaling_group": self.fake.group,
            "endpoint_url": self.fake.url,
            "call_timeout_seconds": 5,
            "retries": 2,
            "token_poll_seconds": 0.05,  # the fake runs scripts for real: a poll every 50 ms, not a spin
        }
        return AwsSettings(**{**values, **overrides})

    def provider(
        self, port: ProviderPort | None = None, vm_token: Callable[[str], str] | None = None, **overrides: Any
    ) -> AwsAutoScalingProvider:
        """A provider on the fake; it reports to this harness unless given another port (a runner's inbox).

        ``vm_token``: hand each instance in service its agent token (none unless given)."""
        provider = AwsAutoScalingProvider(
            self.settings(**overrides),
            self.clock,
            port or self,
            vm_token=vm_token,
            session=boto3.session.Session(region_name=REGION, **CREDENTIALS),
            sleep=self.sleep,
        )
        self.providers.append(provider)
        return provider


@asynccontextmanager
async def harness(moto: MotoServer, folder: Path, **fake: Any) -> AsyncIterator[Harness]:
    """A fresh group in a reset moto, its front, and the providers made on it closed at the end."""
    moto.reset()
    aws = FakeAws(moto, folder / "instances", **fake)
    aws.start()
    h = Harness(aws)
    try:
        yield h
    finally:
        aws.stall(False)
        for provider in h.providers:
            await provider.close()
        aws.stop()


def run(moto: MotoServer, folder: Path, scenario: Callable[[Harness], Awaitable[None]], **fake: Any) -> None:
    """``scenario`` on a fresh group (``fake``: its knobs), in an event loop of its own."""

    async def main() -> None:
        async with harness(moto, folder, **fake) as h:
            await scenario(h)

    asyncio.run(main())
