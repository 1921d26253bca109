"""The GCP provider in the contract suite: tests/gcp's fake Compute Engine server, its own knobs for the rest.

An eviction here is a Spot preemption with the termination action STOP: the instance stays in the group,
TERMINATED, until the provider deletes it and grows the group by a new one. (With DELETE the group itself
recreates the VM under the same name, which tests/gcp/test_provider.py covers: a name that comes back.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from controller.providers.gcp import GcpInstanceGroupProvider
from tests.gcp.fake_compute import FakeCompute
from tests.gcp.harness import harness
from tests.providers.contract import Clock, Factory, Options, Port, Subject, pending, settle

ON_DEMAND = "ondemand"  # the group of standard VMs beside the Spot one
STOPPED = frozenset({"STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED"})


@dataclass
class GcpCloud:
    fake: FakeCompute

    def names(self) -> frozenset[str]:
        instances = [i for group in self.fake.groups.values() for i in group.instances.values()]
        return frozenset(
            i.name for i in instances if i.action not in ("DELETING", "ABANDONING") and i.status not in STOPPED
        )

    def mutations(self) -> int:
        return len(self.fake.mutations())

    def requests(self) -> int:
        return len(self.fake.requests)

    def evict(self, name: str) -> None:
        self.fake.preempt(name, action="STOP")

    def throttle(self, requests: int) -> None:
        self.fake.throttle(requests)

    def unreachable(self, on: bool) -> None:
        self.fake.unreachable = on

    def stall(self, on: bool) -> None:
        self.fake.op_polls = 10**9 if on else 1


def gcp_factory() -> Factory:
    @asynccontextmanager
    async def make(options: Options) -> AsyncIterator[Subject]:
        async with harness() as h:
            clock, port = Clock(), Port()
            h.clock = clock
            cloud = GcpCloud(h.fake)
            on_demand: dict[str, Any] = {}
            if options.on_demand_instances:
                h.fake.add_group(ON_DEMAND, template="spotmorph-worker-on-demand")  # standard VMs, no Spot scheduling
                on_demand = {
                    "on_demand_instance_group": ON_DEMAND,
                    "on_demand_max_capacity": options.on_demand_instances,
                }

            def provider() -> GcpInstanceGroupProvider:
                return h.provider(
                    port,
                    target_capacity=0,
                    max_capacity=options.max_instances,
                    slots_per_instance=options.slots_per_instance,
                    retries=options.retries,
                    **on_demand,
                )

            try:  # the harness closes its providers on exit
                yield Subject(provider(), cloud, port, clock, settle, pending, provider)
            finally:
                cloud.stall(False)

    return make
