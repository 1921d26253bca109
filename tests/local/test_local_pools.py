"""The local provider's pools: on-demand VMs beside spot ones, each pool's level its own, listed with their pool,
and never evicted by the (simulated) cloud; the static provider has no pool to ask."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from controller.providers.base import PoolNotConfigured, StaticProvider
from morphing.errors import UserInputError
from scheduler.pools import PoolKind
from spotmorph.local import cluster
from spotmorph.local.provider import LocalProcessProvider, kill_vm

SLEEPER = (sys.executable, "-c", "import time; time.sleep(120)")  # an "agent" that only lives


def provider(tmp_path: Path) -> LocalProcessProvider:
    return LocalProcessProvider(tmp_path, "127.0.0.1:1", slots=2, command=SLEEPER, max_nodes=3, cloud="azure")


def registered(p: LocalProcessProvider) -> None:
    """What each agent does once it registers: its node name in its folder."""
    for vm in p.vms():
        vm.node_name_file.write_text(f"node-{vm.serial}\n")


def test_each_pool_has_its_own_level_and_its_vms_say_their_pool(tmp_path: Path) -> None:
    async def scenario() -> None:
        p = provider(tmp_path)
        try:
            await p.request_capacity(4)  # 2 spot VMs of 2 slots
            await p.request_capacity(2, PoolKind.ON_DEMAND)  # 1 on-demand VM
            await p.request_capacity(2, PoolKind.ON_DEMAND)  # a level: nothing more
            await p.request_capacity(4)
            registered(p)
            pools = await p.list_pools()
            assert sorted(pools.values()) == [PoolKind.ON_DEMAND, PoolKind.SPOT, PoolKind.SPOT]
            assert await p.list_instances() == frozenset(pools)
            (on_demand,) = [n for n, kind in pools.items() if kind is PoolKind.ON_DEMAND]
            with pytest.raises(UserInputError, match="on-demand VM, which the cloud never evicts"):
                cluster.require_node(p, on_demand, evicting="cannot preempt")
            spot = next(n for n, kind in pools.items() if kind is PoolKind.SPOT)
            assert cluster.require_node(p, spot, evicting="cannot preempt").pool is PoolKind.SPOT
            await p.release(on_demand)
            assert on_demand not in await p.list_pools()
            await p.request_capacity(2, PoolKind.ON_DEMAND)  # the level again: a new on-demand VM
            assert [vm.pool for vm in p.vms() if vm.alive()].count(PoolKind.ON_DEMAND) == 1
        finally:
            for vm in p.vms():
                kill_vm(vm)

    asyncio.run(scenario())


def test_the_static_provider_refuses_on_demand_naming_what_to_use_instead() -> None:
    async def scenario() -> None:
        static = StaticProvider()
        await static.request_capacity(3)  # nobody to ask
        await static.request_capacity(0, PoolKind.ON_DEMAND)
        with pytest.raises(PoolNotConfigured, match="no on-demand pool: a static cluster's nodes are the operator's"):
            await static.request_capacity(1, PoolKind.ON_DEMAND)

    asyncio.run(scenario())


def test_up_with_on_demand_nodes_gives_the_controller_the_local_provider_and_the_deadline_times() -> None:
    from controller.app.settings import ControllerSettings
    from morphing.errors import UserInputError
    from spotmorph.local.cluster import UpOptions, controller_settings

    plain = controller_settings(UpOptions(), 29500, "http://127.0.0.1:9")
    assert "provider" not in plain and "scheduler" not in plain  # as before: the controller starts no VM
    timing = (("safety_seconds", 5.0), ("outlook_step_seconds", 3600.0))
    options = UpOptions(slots=1, on_demand_nodes=2, scheduler=timing)
    settings = ControllerSettings(**controller_settings(options, 29500, "http://127.0.0.1:9"))
    assert settings.provider == "local" and settings.local.max_nodes == 0
    assert settings.local.max_on_demand_nodes == 2 and settings.local.slots == 1
    assert settings.local.imds_url == "http://127.0.0.1:9"
    assert (settings.scheduler.safety_seconds, settings.scheduler.outlook_step_seconds) == (5.0, 3600.0)
    for bad, flag in (
        (UpOptions(on_demand_nodes=-1), "--on-demand-nodes"),
        (UpOptions(scheduler=(("safety_seconds", -1.0),)), "--deadline-safety"),
    ):
        with pytest.raises(UserInputError, match=flag):
            bad.check()
