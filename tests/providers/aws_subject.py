"""The AWS provider in the contract suite: moto's server behind tests/aws's front."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from controller.providers.aws import AwsAutoScalingProvider
from tests.aws.fake_aws import FakeAws, MotoServer
from tests.aws.harness import harness
from tests.providers.contract import Clock, Factory, Options, Port, Subject, pending, settle

ON_DEMAND = "spotmorph-on-demand"  # the group of On-Demand instances beside the Spot one


@dataclass
class AwsCloud:
    fake: FakeAws

    def names(self) -> frozenset[str]:
        on_demand = self.fake.on_demand_group
        return self.fake.names() | (self.fake.names(on_demand) if on_demand else frozenset())

    def mutations(self) -> int:
        return len(self.fake.mutations())

    def requests(self) -> int:
        return len(self.fake.requests)

    def evict(self, name: str) -> None:
        self.fake.evict(name)

    def throttle(self, requests: int) -> None:
        self.fake.throttle(requests)

    def unreachable(self, on: bool) -> None:
        self.fake.unreachable(on)

    def stall(self, on: bool) -> None:
        self.fake.stall(on)


def aws_factory(moto: MotoServer, folder: Path) -> Factory:
    @asynccontextmanager
    async def make(options: Options) -> AsyncIterator[Subject]:
        group = ON_DEMAND if options.on_demand_instances else None
        async with harness(moto, folder, on_demand_group=group) as h:  # closes its providers, unstalled first
            clock, port = Clock(), Port()
            h.clock = clock

            def provider() -> AwsAutoScalingProvider:
                return h.provider(
                    port,
                    max_capacity=options.max_instances,
                    slots_per_instance=options.slots_per_instance,
                    retries=options.retries,
                    throttle_seconds=min(30.0, options.throttle_backoff_seconds),
                    on_demand_auto_scaling_group=group,
                    on_demand_max_capacity=options.on_demand_instances or None,
                )

            yield Subject(provider(), AwsCloud(h.fake), port, clock, settle, pending, provider)

    return make
