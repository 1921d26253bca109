"""The instance-group provider through the real google-cloud-compute REST client against the fake server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import requests
from google.api_core import exceptions as api

from controller.providers.gcp import ProviderUnavailable
from controller.providers.gcp_errors import OperationFailed, describe, retry_wait
from tests.gcp.harness import GROUP, Harness, run, settle


def test_fills_the_group_and_lists_instances_by_name_through_pages() -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(target_capacity=7)
        assert await provider.list_instances() == frozenset()  # an empty group: a resize starts
        await settle(provider)
        names = await provider.list_instances()
        assert names == frozenset(h.fake.running(GROUP)) and len(names) == 7  # 5 a page
        assert h.fake.groups[GROUP].target_size == 7
        assert h.kinds() == ["ProviderScaleOut", "ProviderScaleOutDone"]
        assert h.events[0][1]["message"] == "targetSize 0 -> 7 (0 alive)"
        await provider.list_instances()
        await settle(provider)
        assert [p.rsplit("/", 1)[1] for _, p in h.fake.mutations()] == ["resize"]  # at target: nothing more

    run(scenario)


def test_instances_being_created_are_listed_and_not_asked_for_twice() -> None:
    async def scenario(h: Harness) -> None:
        h.fake.op_polls = 10_000  # the resize never ends unless the test says so
        provider = h.provider(target_capacity=3)
        await provider.list_instances()
        while not h.fake.in_progress():
            await asyncio.sleep(0)
        for task in provider.pending.values():
            task.cancel()  # the controller dies mid-operation ...
        await asyncio.gather(*provider.pending.values(), return_exceptions=True)
        again = h.provider(target_capacity=3)  # ... and its successor looks at the group
        assert len(await again.list_instances()) == 3  # CREATING: agents boot there
        await settle(again)
        assert [p.rsplit("/", 1)[1] for _, p in h.fake.mutations()] == ["resize"]

    run(scenario)


def test_preempted_vms_make_nodes_gone_and_the_group_recreates_them_under_their_names() -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.running(GROUP)
        provider = h.provider(target_capacity=4)
        before = await provider.list_instances()
        assert before == frozenset(names) and len(names) == 4
        h.fake.preempt(names[0])  # termination action DELETE: the group recreates it
        listed = await provider.list_instances()
        assert listed == frozenset(names[1:])  # no agent said a word: the list does
        await settle(provider)
        assert not h.fake.mutations(), "a VM the group brings back itself is not replaced"
        assert await provider.list_instances() == frozenset(names)  # CREATING again, under its name
        old_id = provider.instances[names[0]].instance_id
        assert await provider.list_instances() == frozenset(names)
        assert provider.instances[names[0]].instance_id not in ("", old_id)  # a new VM

    run(scenario, running=4)


def test_stopped_vms_are_deleted_then_replaced() -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.running(GROUP)
        provider = h.provider(target_capacity=4)
        await provider.list_instances()
        h.fake.preempt(names[1], action="STOP")
        assert await provider.list_instances() == frozenset(names) - {names[1]}
        await settle(provider)
        assert names[1] not in h.fake.groups[GROUP].instances and h.fake.groups[GROUP].target_size == 3
        await provider.list_instances()  # a later poll grows the group back
        await settle(provider)
        assert len(await provider.list_instances()) == 4 and h.fake.groups[GROUP].target_size == 4
        assert h.kinds() == ["ProviderDeleteInstances", "ProviderScaleOut", "ProviderScaleOutDone"]

    run(scenario, running=4)


def test_a_stockout_is_one_event_and_the_group_keeps_trying() -> None:
    async def scenario(h: Harness) -> None:
        h.fake.stockout = "ZONE_RESOURCE_POOL_EXHAUSTED"
        provider = h.provider(target_capacity=3)
        await provider.list_instances()
        await settle(provider)
        assert len(await provider.list_instances()) == 3  # CREATING, with their last attempt's error
        await provider.list_instances()
        assert h.kinds().count("ProviderCapacityUnavailable") == 1
        failure = next(data for kind, data in h.events if kind == "ProviderCapacityUnavailable")
        assert failure["operation"] == "create" and "ZONE_RESOURCE_POOL_EXHAUSTED" in failure["message"]
        h.fake.stockout = None
        await provider.list_instances()
        assert len(h.fake.running(GROUP)) == 3 and len(h.fake.mutations()) == 1

    run(scenario)


def test_throttling_is_retried_then_backs_off() -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(target_capacity=4, retries=2, retry_seconds=0.5)
        h.fake.throttle(2, status=403)  # 403 rateLimitExceeded: retried after 0.5 s, then 1 s
        assert len(await provider.list_instances()) == 4
        assert h.slept == [0.5, 1.0] and h.kinds() == []
        h.fake.throttle(2, status=429, retry_after=7)
        assert len(await provider.list_instances()) == 4
        assert h.slept[2:] == [7.0, 7.0]  # Retry-After wins
        h.fake.throttle(10, status=429, retry_after=40)  # more than the retries: the provider backs off
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert h.kinds() == ["ProviderThrottled"] and provider.backoff.throttled_until == h.clock.now() + 40
        sent = len(h.fake.requests)
        h.clock.advance(39)
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert len(h.fake.requests) == sent  # nothing sent before Retry-After
        h.fake.throttle(0)
        h.clock.advance(1)
        assert len(await provider.list_instances()) == 4

    run(scenario, running=4)


def test_an_unreachable_api_cannot_list_and_is_one_event() -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(target_capacity=2, retries=1)
        h.fake.unreachable = True
        for _ in range(2):
            with pytest.raises(ProviderUnavailable):
                await provider.list_instances()
        assert h.kinds() == ["ProviderUnreachable"] and len(h.fake.requests) == 4  # each retried once
        h.fake.unreachable = False
        assert len(await provider.list_instances()) == 2

    run(scenario, running=2)


def test_quota_on_an_operation_backs_off_then_recovers() -> None:
    async def scenario(h: Harness) -> None:
        h.fake.fail_operations = {"code": "QUOTA_EXCEEDED", "message": "Quota 'PREEMPTIBLE_NVIDIA_L4_GPUS' exceeded."}
        provider = h.provider(target_capacity=3, backoff_seconds=30, max_backoff_seconds=100)
        await provider.list_instances()
        await settle(provider)
        assert h.kinds()[-1] == "ProviderCapacityUnavailable" and "QUOTA_EXCEEDED" in h.events[-1][1]["message"]
        asked = len(h.fake.mutations())
        h.clock.advance(29)
        await provider.list_instances()
        await settle(provider)
        assert len(h.fake.mutations()) == asked  # not during the backoff
        h.fake.fail_operations = None
        h.clock.advance(2)
        await provider.list_instances()
        await settle(provider)
        assert len(await provider.list_instances()) == 3 and provider.backoff.seconds == 0

    run(scenario)


def test_release_deletes_by_name_but_never_a_busy_node_without_the_operator() -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.running(GROUP)
        provider = h.provider(target_capacity=3)
        await provider.list_instances()
        h.busy_nodes.add(names[0])
        await provider.release(names[0])
        await settle(provider)
        assert h.kinds()[-1] == "ProviderReleaseRefused" and not h.fake.mutations()
        await provider.release(names[1])  # a LOST node: deleted, and the group shrinks with it
        await settle(provider)
        assert names[1] not in h.fake.groups[GROUP].instances and h.fake.groups[GROUP].target_size == 2
        await provider.release(names[0], force=True)  # the operator says so
        await settle(provider)
        assert names[0] not in h.fake.groups[GROUP].instances
        await provider.release("spot-ffff")  # unknown: nothing to do, no error
        await settle(provider)
        assert h.kinds().count("ProviderDeleteInstances") == 2

    run(scenario, running=3)


def test_scale_in_deletes_idle_instances_never_busy_ones() -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.running(GROUP)
        h.busy_nodes.update(names[2:])
        provider = h.provider(target_capacity=1)
        await provider.list_instances()
        await settle(provider)
        assert h.fake.running(GROUP) == sorted(names[2:])  # 3 too many: the 2 idle go, busy ones stay
        assert "ProviderScaleInDeferred" in h.kinds()
        assert [p.rsplit("/", 1)[1] for _, p in h.fake.mutations()] == ["deleteInstances"]  # never a resize down

    run(scenario, running=4)


def test_wrong_group_is_an_event_not_a_crash() -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(instance_group="elsewhere")
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert h.kinds() == ["ProviderNotFound"] and "instance_group" in h.events[0][1]["message"]
        await provider.release("spot-0001", force=True)  # never listed: nothing to delete

    run(scenario)


def error(status: int, message: str, **details: Any) -> api.GoogleAPICallError:
    made: api.GoogleAPICallError = api.from_http_status(status, message, **details)  # type: ignore[no-untyped-call]
    return made


def test_describe_and_retry_wait_read_errors_of_any_shape() -> None:
    forbidden = error(403, "no", errors=[{"reason": "forbidden"}, "junk", {"reason": 7}])
    assert describe(forbidden).kind == "ProviderAuthFailed"
    assert describe(error(403, "q", errors=[{"reason": "quotaExceeded"}])).kind == "ProviderCapacityUnavailable"
    assert describe(error(409, "busy")).kind == "ProviderConflict"
    assert describe(error(500, "x")).kind == "ProviderUnreachable"
    assert describe(requests.ConnectionError("refused")).kind == "ProviderUnreachable"
    assert describe(OperationFailed("resize", ["STOCKOUT"], "none")).kind == "ProviderCapacityUnavailable"
    assert describe(OperationFailed("resize", ["BAD"], "x" * 1000)).message.endswith("x" * 10)
    assert len(describe(ValueError("y" * 10_000)).message) < 400
    assert retry_wait(error(400, "no"), 0, 1.0) is None
    assert retry_wait(error(503, "later"), 2, 1.0) == 4.0
