"""The provider contract (contract.py says it) on every cloud's provider, each through its fake cloud."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from controller.providers.base import CannotList, PoolNotConfigured
from scheduler.pools import PoolKind
from tests.providers.contract import Factory, Options, Subject, converge

# provider -> the fixture that returns its factory (conftest.py); a new provider adds its line here
SUBJECTS = {"azure": "azure_subject", "aws": "aws_subject", "gcp": "gcp_subject"}
MARKS = {"aws": [pytest.mark.xdist_group("moto")]}  # the worker whose moto is warm (make test: --dist loadgroup)


@pytest.fixture(params=[pytest.param(name, marks=MARKS.get(name, [])) for name in SUBJECTS])
def make(request: pytest.FixtureRequest) -> Factory:
    factory: Factory = request.getfixturevalue(SUBJECTS[request.param])
    return factory


def run(make: Factory, scenario: Callable[[Subject], Awaitable[None]], options: Options | None = None) -> None:
    async def main() -> None:
        async with make(options or Options()) as subject:
            await scenario(subject)

    asyncio.run(main())


def test_the_level_is_reached_up_and_down(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        assert await s.provider.list_instances() == frozenset()
        await s.provider.request_capacity(7)  # 2 slots an instance: 4
        listed = await converge(s)
        assert listed == s.cloud.names() and len(listed) == 4
        await s.provider.request_capacity(3)
        listed = await converge(s)
        assert listed == s.cloud.names() and len(listed) == 2
        await s.provider.request_capacity(0)
        assert await converge(s) == s.cloud.names() == frozenset()

    run(make, scenario)


def test_the_same_level_again_or_after_a_restart_changes_nothing(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.request_capacity(4)
        before = await converge(s)
        changes = s.cloud.mutations()
        await s.provider.request_capacity(4)
        assert await converge(s) == before and s.cloud.mutations() == changes
        restarted = s.restart()
        await restarted.request_capacity(4)
        assert await converge(s, restarted) == before and s.cloud.mutations() == changes

    run(make, scenario)


def test_a_level_above_the_ceiling_is_said_and_capped(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.list_instances()
        await s.provider.request_capacity(100)
        assert len(await converge(s)) == 4
        said = s.port.kinds.count("ProviderCapacityLimited")
        assert said >= 1
        await converge(s)
        assert s.port.kinds.count("ProviderCapacityLimited") == said, "not again on every poll"

    run(make, scenario)


def test_a_released_instance_is_not_listed_and_a_busy_one_is_not_released(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.request_capacity(6)
        victim, busy, _ = sorted(await converge(s))
        await s.provider.release(victim)
        await s.settle(s.provider)
        assert victim not in await s.provider.list_instances() and victim not in s.cloud.names()
        s.port.busy_nodes.add(busy)
        await s.provider.release(busy)
        await s.settle(s.provider)
        assert "ProviderReleaseRefused" in s.port.kinds and busy in s.cloud.names()
        assert busy in await converge(s)
        await s.provider.release("never-listed")  # nothing to do, no error
        await s.settle(s.provider)

    run(make, scenario)


def test_an_evicted_instance_is_not_listed_and_is_replaced(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.request_capacity(4)
        victim = sorted(await converge(s))[0]
        s.cloud.evict(victim)
        assert victim not in await s.provider.list_instances()
        listed = await converge(s)
        assert len(listed) == 2 and victim not in listed and listed == s.cloud.names()

    run(make, scenario)


def test_an_unreachable_api_cannot_list_and_is_said(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.request_capacity(2)
        listed = await converge(s)
        s.cloud.unreachable(True)
        with pytest.raises(CannotList):
            await s.provider.list_instances()
        assert "ProviderUnreachable" in s.port.kinds
        s.cloud.unreachable(False)
        assert await s.provider.list_instances() == listed

    run(make, scenario)


def test_throttling_is_retried_then_said_once_and_waited_out(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.request_capacity(2)
        listed = await converge(s)
        s.cloud.throttle(1)  # fewer than the retries: not even seen
        assert await s.provider.list_instances() == listed and "ProviderThrottled" not in s.port.kinds
        s.cloud.throttle(1000)
        with pytest.raises(CannotList):
            await s.provider.list_instances()
        sent = s.cloud.requests()
        with pytest.raises(CannotList):
            await s.provider.list_instances()
        assert s.cloud.requests() == sent, "nothing sent while backing off"
        assert s.port.kinds.count("ProviderThrottled") == 1
        s.cloud.throttle(0)
        s.clock.advance(Options().throttle_backoff_seconds)
        assert await s.provider.list_instances() == listed

    run(make, scenario)


def test_close_ends_background_work_even_stalled(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.list_instances()
        s.cloud.stall(True)
        await s.provider.request_capacity(4)
        await s.provider.list_instances()
        assert s.pending(s.provider) > 0
        await asyncio.wait_for(s.provider.close(), 10)
        assert s.pending(s.provider) == 0

    run(make, scenario)


def test_each_pool_keeps_its_own_level_and_releases_from_its_own_group(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        p = s.provider
        await p.request_capacity(4)  # 2 spot instances
        await p.request_capacity(2, PoolKind.ON_DEMAND)  # 1 on-demand instance
        listed = await converge(s)
        pools = await p.list_pools()
        assert listed == frozenset(pools) == s.cloud.names()
        spot = sorted(n for n, kind in pools.items() if kind is PoolKind.SPOT)
        (on_demand,) = [n for n, kind in pools.items() if kind is PoolKind.ON_DEMAND]
        assert len(spot) == 2
        changes = s.cloud.mutations()
        await p.request_capacity(2, PoolKind.ON_DEMAND)
        restarted = s.restart()
        await restarted.request_capacity(4)
        await restarted.request_capacity(2, PoolKind.ON_DEMAND)
        assert await converge(s, restarted) == listed and s.cloud.mutations() == changes, "levels, not increments"
        await p.list_pools()
        await p.release(on_demand)  # when spot returns, the controller gives on-demand back first
        await p.request_capacity(0, PoolKind.ON_DEMAND)
        await s.settle(p)
        after = await converge(s)
        assert on_demand not in after and after == s.cloud.names()
        assert set((await p.list_pools()).values()) == {PoolKind.SPOT} and sorted(after) == spot

    run(make, scenario, Options(on_demand_instances=2))


def test_without_an_on_demand_group_on_demand_is_refused_naming_the_setting(make: Factory) -> None:
    async def scenario(s: Subject) -> None:
        await s.provider.request_capacity(0, PoolKind.ON_DEMAND)  # "none" is always granted
        with pytest.raises(PoolNotConfigured, match="on_demand"):
            await s.provider.request_capacity(2, PoolKind.ON_DEMAND)
        await s.provider.request_capacity(2)
        await converge(s)
        assert set((await s.provider.list_pools()).values()) == {PoolKind.SPOT}

    run(make, scenario)
