"""The GCP provider on the real client against the fake Compute Engine server: clock, waits, events."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from controller.providers.base import ProviderPort
from controller.providers.gcp import GcpInstanceGroupProvider
from controller.providers.gcp_config import GcpSettings
from tests.clouds import Clock, RecordingPort, settle
from tests.gcp.fake_compute import FakeCompute

__all__ = ["GROUP", "Clock", "Harness", "harness", "run", "served", "settle"]

GROUP = "spot"


@dataclass
class Harness(RecordingPort):
    """The fake server, an injected clock, and the provider port (events recorded, busy nodes set by tests).

    The provider's waits (retries, operation polls) are recorded, not slept."""

    fake: FakeCompute
    clock: Clock
    providers: list[GcpInstanceGroupProvider] = field(default_factory=list)

    def settings(self, **overrides: Any) -> GcpSettings:
        values: dict[str, Any] = {
            "project": self.fake.project,
            "zone": self.fake.zone,
            "instance_group": GROUP,
            "target_capacity": 4,
            "api_endpoint": self.fake.base_url,  # http:// on loopback: anonymous credentials
            "identity_certs": f"{self.fake.base_url}/oauth2/v3/certs",
            "retry_seconds": 0.5,
            "operation_poll_seconds": 0.25,
        }
        return GcpSettings(**{**values, **overrides})

    def provider(self, port: ProviderPort | None = None, **overrides: Any) -> GcpInstanceGroupProvider:
        """A provider on the fake; it reports to this harness unless given another port (a runner's inbox)."""
        provider = GcpInstanceGroupProvider(self.settings(**overrides), self.clock, port or self, sleep=self.sleep)
        self.providers.append(provider)
        return provider


@asynccontextmanager
async def harness(running: int = 0, **fake: Any) -> AsyncIterator[Harness]:
    """A fake with group ``spot`` holding ``running`` running instances (``fake``: its knobs)."""
    compute = FakeCompute(**fake)
    compute.add_group(GROUP, running=running)
    await compute.start()
    h = Harness(compute, Clock())
    try:
        yield h
    finally:
        for provider in h.providers:
            await provider.close()
        await compute.stop()


def run(scenario: Callable[[Harness], Awaitable[None]], running: int = 0, **fake: Any) -> None:
    """``scenario`` on a fresh fake server, in an event loop of its own."""

    async def main() -> None:
        async with harness(running, **fake) as h:
            await scenario(h)

    asyncio.run(main())


@contextmanager
def served(running: int = 0, **fake: Any) -> Iterator[FakeCompute]:
    """The fake with group ``spot``, served from an event loop of its own (for a controller in another thread)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    compute = FakeCompute(**fake)
    compute.add_group(GROUP, running=running)
    asyncio.run_coroutine_threadsafe(compute.start(), loop).result(10)
    try:
        yield compute
    finally:
        asyncio.run_coroutine_threadsafe(compute.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
