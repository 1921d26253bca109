"""The provider on the real SDK against the fake ARM server: clock, credential, transport, events."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.core.credentials import AccessToken
from azure.core.pipeline.transport._aiohttp import AioHttpTransport

from controller.providers.azure import AzureScaleSetProvider
from controller.providers.azure_config import AzureSettings
from controller.providers.base import ProviderPort
from tests.azure.fake_arm import TOKEN, FakeArm
from tests.clouds import Clock, RecordingPort, settle

__all__ = ["Clock", "Harness", "harness", "run", "settle"]

SUBSCRIPTION = "00000000-0000-4000-8000-000000000001"


class FakeCredential:
    """An azure.identity.aio-shaped credential that hands out a fixed token, offline."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.calls += 1
        assert scopes and scopes[0].endswith("/.default"), scopes
        return AccessToken(TOKEN, int(time.time()) + 3600)

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> FakeCredential:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class RecordingTransport(AioHttpTransport):
    """The SDK's own aiohttp transport, except that its sleeps (retries, polling) are recorded."""

    def __init__(self, ca_file: Path, slept: list[float]) -> None:
        super().__init__(connection_verify=str(ca_file), use_env_settings=False)
        self.slept = slept

    async def sleep(self, duration: float) -> None:
        self.slept.append(duration)


@dataclass
class Harness(RecordingPort):
    """The fake ARM server, an injected clock, and the provider port (events recorded, busy nodes set by tests);
    the SDK's own waits (retries, polling) land in ``slept``."""

    fake: FakeArm
    clock: Clock
    providers: list[AzureScaleSetProvider] = field(default_factory=list)

    def settings(self, **overrides: Any) -> AzureSettings:
        values: dict[str, Any] = {
            "subscription_id": SUBSCRIPTION,
            "resource_group": self.fake.group,
            "scale_set": self.fake.scale_set,
            "target_capacity": 4,
            "orchestration_mode": self.fake.orchestration,
            "arm_endpoint": self.fake.base_url,
        }
        return AzureSettings(**{**values, **overrides})

    def provider(
        self, port: ProviderPort | None = None, vm_token: Callable[[str], str] | None = None, **overrides: Any
    ) -> AzureScaleSetProvider:
        """A provider on the fake; it reports to this harness unless given another port (a runner's inbox).

        ``vm_token``: hand each running VM its agent token (none unless given)."""
        assert self.fake.ca_file is not None
        provider = AzureScaleSetProvider(
            self.settings(**overrides),
            self.clock,
            port or self,
            credential=FakeCredential(),
            vm_token=vm_token,
            transport=RecordingTransport(self.fake.ca_file, self.slept),
            polling_interval=0,
        )
        self.providers.append(provider)
        return provider


@asynccontextmanager
async def harness(folder: Path, **fake: Any) -> AsyncIterator[Harness]:
    arm = FakeArm(SUBSCRIPTION, fake.pop("group", "spotmorph-rg"), fake.pop("scale_set", "spot"), **fake)
    await arm.start(folder)
    h = Harness(arm, Clock())
    try:
        yield h
    finally:
        for provider in h.providers:
            await provider.close()
        await arm.stop()


def run(folder: Path, scenario: Callable[[Harness], Awaitable[None]], **fake: Any) -> None:
    """``scenario`` on a fresh fake ARM server (``fake``: its knobs), in an event loop of its own."""
    import asyncio

    async def main() -> None:
        async with harness(folder, **fake) as h:
            await scenario(h)

    asyncio.run(main())
