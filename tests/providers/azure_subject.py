"""The Azure provider in the contract suite: tests/azure's fake ARM server behind a gate (unreachable on demand)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.providers.azure import AzureScaleSetProvider
from controller.providers.azure_scale import GONE_POWER
from tests.azure.fake_arm import FakeArm
from tests.azure.harness import harness
from tests.providers.contract import Clock, Factory, Options, Port, Subject, pending, settle
from tests.providers.gate import Gate

ON_DEMAND = "ondemand"  # the Regular scale set beside the Spot one


@dataclass
class AzureCloud:
    fake: FakeArm
    gate: Gate

    def names(self) -> frozenset[str]:
        vms = [v for fake in (self.fake, *self.fake.siblings.values()) for v in fake.vms.values()]
        return frozenset(v.name for v in vms if v.provisioning != "Deleting" and v.power not in GONE_POWER)

    def mutations(self) -> int:
        return len(self.fake.mutations())

    def requests(self) -> int:
        return len(self.fake.requests)

    def evict(self, name: str) -> None:
        vm = next(v for v in self.fake.vms.values() if v.name == name)
        vm.provisioning, vm.power = "Deleting", "deallocating"  # the Delete eviction policy

    def throttle(self, requests: int) -> None:
        self.fake.throttle(requests, retry_after=30)

    def unreachable(self, on: bool) -> None:
        self.gate.refuse(on)

    def stall(self, on: bool) -> None:
        self.fake.op_polls = 10**9 if on else 1


def azure_factory(folder: Path) -> Factory:
    @asynccontextmanager
    async def make(options: Options) -> AsyncIterator[Subject]:
        async with harness(folder) as h:
            gate = Gate(("127.0.0.1", int(h.fake.base_url.rsplit(":", 1)[1])))
            h.fake.base_url = f"https://{await gate.start()}"  # operations and pages are polled through it too
            clock, port = Clock(), Port()
            h.clock = clock
            cloud = AzureCloud(h.fake, gate)
            on_demand: dict[str, Any] = {}
            if options.on_demand_instances:
                h.fake.add_scale_set(ON_DEMAND)  # Regular priority
                on_demand = {"on_demand_scale_set": ON_DEMAND, "on_demand_max_capacity": options.on_demand_instances}

            def provider() -> AzureScaleSetProvider:
                return h.provider(
                    port,
                    target_capacity=0,
                    max_capacity=options.max_instances,
                    slots_per_instance=options.slots_per_instance,
                    retries=options.retries,
                    **on_demand,
                )

            try:  # the harness closes its providers on exit (closing one the test closed does nothing)
                yield Subject(provider(), cloud, port, clock, settle, pending, provider)
            finally:
                cloud.stall(False)
                await gate.stop()

    return make
