"""The scale-set provider through the real SDK against the fake ARM server (HTTPS on loopback)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError

from controller.providers.azure import ProviderUnavailable, describe
from tests.azure.harness import Harness, run, settle


@pytest.mark.parametrize("mode", ["Uniform", "Flexible"])
def test_fills_the_scale_set_and_lists_running_instances_by_vm_name(tmp_path: Path, mode: str) -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(target_capacity=7)
        assert await provider.list_instances() == frozenset()  # empty set: scale out starts
        await settle(provider)
        names = await provider.list_instances()
        assert names == frozenset(h.fake.running()) and len(names) == 7  # paged: 5 a page
        assert h.fake.capacity == 7
        assert ("PATCH", h.fake._vmss_path) in h.fake.requests
        assert h.kinds() == ["ProviderScaleOut", "ProviderScaleOutDone"]
        assert all(v.startswith("spot_") for v in names)
        await provider.list_instances()
        await settle(provider)
        assert len(h.fake.mutations()) == 1  # at target: nothing more to do

    run(tmp_path, scenario, orchestration=mode)


def test_eviction_storm_half_the_set_is_noticed_and_replaced(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        before = set(h.fake.add_running(8))
        provider = h.provider(target_capacity=8)
        assert await provider.list_instances() == frozenset(before)
        evicted = sorted(before)[::2]
        # Azure evicts half the set at once (driven through the SDK's simulateEviction call).
        ids = [provider.instances[name].instance_id for name in evicted]
        await asyncio.gather(
            *(provider.client.virtual_machine_scale_set_vms.simulate_eviction("spotmorph-rg", "spot", i) for i in ids)
        )
        listed = await provider.list_instances()  # no agent reported a notice: the list says it
        assert listed == before - set(evicted)
        await settle(provider)  # capacity 8 + 4 dying counted: scaled to 12, i.e. 4 new
        listed = await provider.list_instances()
        await settle(provider)
        listed = await provider.list_instances()
        assert len(listed) == 8 and not listed & set(evicted)
        assert h.fake.capacity == 8
        assert "ProviderScaleOutDone" in h.kinds()

    run(tmp_path, scenario)


def test_deallocated_instances_are_gone_and_deleted(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add_running(4)
        provider = h.provider(target_capacity=4)
        await provider.list_instances()
        await provider.client.virtual_machine_scale_set_vms.simulate_eviction("spotmorph-rg", "spot", "1")
        listed = await provider.list_instances()
        assert names[1] not in listed and len(listed) == 3
        await settle(provider)
        assert "1" not in h.fake.vms  # the deallocated instance was deleted ...
        await provider.list_instances()
        await settle(provider)
        assert len(await provider.list_instances()) == 4  # ... and replaced

    run(tmp_path, scenario, eviction_policy="Deallocate")


def test_capacity_unavailable_backs_off_then_recovers(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.fake.add_running(2)
        h.fake.capacity_unavailable = True
        provider = h.provider(target_capacity=4, backoff_seconds=30, max_backoff_seconds=100)
        await provider.list_instances()
        await settle(provider)
        assert h.kinds()[-1] == "ProviderCapacityUnavailable"
        assert "AllocationFailed" in h.events[-1][1]["message"]
        assert h.fake.capacity == 2  # the failed scale-out left nothing behind
        patches = len(h.fake.mutations())
        h.clock.advance(29)
        await provider.list_instances()  # still listing, but not asking again during the backoff
        await settle(provider)
        assert len(h.fake.mutations()) == patches
        h.clock.advance(2)
        await provider.list_instances()
        await settle(provider)
        assert len(h.fake.mutations()) == patches + 1 and provider.backoff.seconds == 60  # doubled
        h.clock.advance(61)
        await provider.list_instances()
        await settle(provider)
        assert provider.backoff.seconds == 100  # capped
        assert h.kinds().count("ProviderCapacityUnavailable") == 1  # the same failure is one event
        h.fake.capacity_unavailable = False
        h.clock.advance(101)
        await provider.list_instances()
        await settle(provider)
        assert len(await provider.list_instances()) == 4 and provider.backoff.seconds == 0

    run(tmp_path, scenario)


def test_throttling_honours_retry_after(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.fake.add_running(4)
        provider = h.provider(target_capacity=4, retries=2)
        h.fake.throttle(2, retry_after=17)  # the SDK retries twice, sleeping Retry-After (injected)
        assert len(await provider.list_instances()) == 4
        assert h.slept.count(17) == 2
        h.fake.throttle(10, retry_after=40)  # more than the SDK retries: the provider backs off
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert h.kinds()[-1] == "ProviderThrottled" and provider.backoff.throttled_until == h.clock.now() + 40
        sent = len(h.fake.requests)
        h.clock.advance(39)
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert len(h.fake.requests) == sent  # nothing sent before Retry-After
        h.fake.throttle(0, 0)
        h.clock.advance(1)
        assert len(await provider.list_instances()) == 4

    run(tmp_path, scenario)


def test_release_deletes_lost_nodes_but_never_a_busy_one_without_the_operator(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add_running(3)
        provider = h.provider(target_capacity=3)
        await provider.list_instances()
        h.busy_nodes.add(names[0])
        await provider.release(names[0])
        await settle(provider)
        assert h.kinds()[-1] == "ProviderReleaseRefused" and len(h.fake.vms) == 3
        assert not h.fake.mutations()
        await provider.release(names[1])  # a LOST node: deleted
        await settle(provider)
        assert names[1] not in {v.name for v in h.fake.vms.values()}
        await provider.release(names[0], force=True)  # the operator says so
        await settle(provider)
        assert names[0] not in {v.name for v in h.fake.vms.values()}
        await provider.release("spot_99")  # unknown: nothing to do, no error
        await settle(provider)

    run(tmp_path, scenario)


def test_scale_in_spares_busy_nodes(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add_running(4)
        h.busy_nodes.update(names[2:])
        provider = h.provider(target_capacity=1)
        await provider.list_instances()
        await settle(provider)
        assert h.fake.running() == sorted(names[2:])  # 3 above target: the 2 idle ones go, busy ones stay
        assert "ProviderScaleInDeferred" in h.kinds()

    run(tmp_path, scenario)


def test_conflict_and_restart_mid_operation(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.fake.op_polls = 10_000  # operations never end unless the test says so
        first = h.provider(target_capacity=4)
        await first.list_instances()
        while not h.fake.in_progress():
            await asyncio.sleep(0)
        assert h.fake.capacity == 4  # the scale-out is under way ...
        for task in first.pending.values():
            task.cancel()  # ... when the controller dies (its pollers with it)
        await asyncio.gather(*first.pending.values(), return_exceptions=True)
        second = h.provider(target_capacity=4)  # the restarted controller
        assert len(await second.list_instances()) == 4  # VMs still being created are listed (agents boot there)
        await settle(second)
        assert len([m for m in h.fake.mutations() if m[0] == "PATCH"]) == 1  # capacity already asked for
        # An operation of its own while Azure is busy: 409, an event, retried on a later poll.
        await second.release("spot_0", force=True)
        await settle(second)
        assert h.kinds()[-1] == "ProviderConflict"
        h.fake.finish_operations()
        assert len(await second.list_instances()) == 4

    run(tmp_path, scenario)


def test_wrong_resource_group_and_auth_are_events_not_crashes(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(resource_group="elsewhere")
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert h.kinds()[-1] == "ProviderNotFound"
        await provider.release("spot_0", force=True)  # never listed: nothing to delete

    run(tmp_path, scenario)


def test_describe_maps_errors() -> None:
    assert describe(HttpResponseError(message="boom")).kind == "ProviderError"
    assert describe(ValueError("x")).kind == "ProviderError"
