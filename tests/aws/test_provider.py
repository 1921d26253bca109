"""The Auto Scaling group provider through real boto3 against moto's server behind the test's front."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import (  # type: ignore[import-untyped]
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
)

from controller.providers.aws import ProviderUnavailable
from controller.providers.aws_failures import describe
from tests.aws.fake_aws import MotoServer
from tests.aws.harness import Harness, run, settle

pytestmark = pytest.mark.xdist_group("moto")  # the worker whose moto is warm (make test: --dist loadgroup)


def test_fills_the_group_to_the_level_and_lists_instances_by_id(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(slots_per_instance=2)
        assert await provider.list_instances() == frozenset()
        await provider.request_capacity(5)
        await provider.list_instances()
        await settle(provider)
        names = await provider.list_instances()
        assert names == h.fake.names() and len(names) == 3
        assert all(n.startswith("i-") for n in names)
        assert h.kinds() == ["ProviderScaleOut", "ProviderScaleOutDone"]
        await provider.list_instances()
        await settle(provider)
        assert len(h.fake.mutations()) == 1

    run(moto_server, tmp_path, scenario)


def test_scale_in_terminates_idle_instances_and_decrements_never_a_busy_one(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add(4)
        h.busy_nodes.update(names[:2])
        provider = h.provider()
        await provider.request_capacity(1)
        await provider.list_instances()
        await settle(provider)
        assert h.fake.names() == frozenset(names[:2])  # 3 above the level: the 2 idle ones go, busy ones stay
        assert h.fake.describe()["DesiredCapacity"] == 2
        assert [a for _, a in h.fake.mutations()] == ["TerminateInstanceInAutoScalingGroup"] * 2
        assert h.kinds() == ["ProviderDeleteInstances", "ProviderScaleInDeferred"]
        await provider.list_instances()
        await settle(provider)
        assert h.kinds().count("ProviderScaleInDeferred") == 1, "said when it changes, not every poll"

    run(moto_server, tmp_path, scenario)


def test_throttling_is_retried_with_growing_waits_then_waited_out(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.fake.add(1)
        provider = h.provider(retries=3, retry_base_seconds=0.5, throttle_seconds=40, min_capacity=1)
        h.fake.throttle(3)
        assert len(await provider.list_instances()) == 1
        assert len(h.slept) == 3 and h.slept[0] <= 0.5 < h.slept[2] <= 2.0  # doubling, jittered
        h.fake.throttle(100)
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert h.kinds() == ["ProviderThrottled"] and h.events[0][1]["retry_at"] == h.clock.now() + 40
        assert "no call for 40 s" in h.events[0][1]["message"]
        sent = len(h.fake.requests)
        h.clock.advance(39)
        with pytest.raises(ProviderUnavailable):
            await provider.list_instances()
        assert len(h.fake.requests) == sent
        h.fake.throttle(0)
        h.clock.advance(1)
        assert len(await provider.list_instances()) == 1

    run(moto_server, tmp_path, scenario)


def test_unreachable_aws_cannot_list_and_says_so_once(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add(2)
        provider = h.provider(retries=1)
        h.fake.unreachable(True)
        for _ in range(2):
            with pytest.raises(ProviderUnavailable):
                await provider.list_instances()
        assert h.kinds() == ["ProviderUnreachable"] and "cannot reach AWS" in h.events[0][1]["message"]
        assert len(h.slept) == 2  # each list tried twice
        h.fake.unreachable(False)
        assert await provider.list_instances() == frozenset(names)

    run(moto_server, tmp_path, scenario)


def test_release_terminates_and_decrements_refuses_a_busy_node_and_ignores_the_unknown(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add(3)
        provider = h.provider(min_capacity=1)
        await provider.request_capacity(3)
        await provider.list_instances()
        h.busy_nodes.add(names[0])
        await provider.release(names[0])
        assert h.kinds()[-1] == "ProviderReleaseRefused" and not h.fake.mutations()
        await provider.release(names[1])
        await settle(provider)
        assert names[1] not in h.fake.names() and h.fake.describe()["DesiredCapacity"] == 2
        await provider.release(names[0], force=True)  # the operator says so
        await settle(provider)
        await provider.release("i-0000000000000000f")  # never listed: nothing to do, no error
        await settle(provider)
        assert h.fake.names() == frozenset({names[2]}) and h.kinds()[-1] == "ProviderDeleteInstances"

    run(moto_server, tmp_path, scenario)


def test_a_missing_group_and_hostile_answers_are_events_not_crashes(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        missing = h.provider(auto_scaling_group="elsewhere")
        with pytest.raises(ProviderUnavailable):
            await missing.list_instances()
        assert h.kinds() == ["ProviderNotFound"] and "no Auto Scaling group elsewhere" in h.events[0][1]["message"]
        provider = h.provider()
        xml = '<DescribeAutoScalingGroupsResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">'
        bad_id = (
            f"{xml}<DescribeAutoScalingGroupsResult><AutoScalingGroups><member><AutoScalingGroupName>spotmorph-spot"
            "</AutoScalingGroupName><DesiredCapacity>1</DesiredCapacity><MinSize>0</MinSize><MaxSize>2</MaxSize>"
            "<Instances><member><InstanceId>i-$(reboot)</InstanceId><LifecycleState>InService</LifecycleState>"
            "</member></Instances></member></AutoScalingGroups></DescribeAutoScalingGroupsResult>"
            "</DescribeAutoScalingGroupsResponse>"
        )
        for status, body, said in [
            (200, "<html><body>a captive portal</body></html>", "an answer that is not AWS's"),
            (200, bad_id, "is not an EC2 instance id"),
            (500, "\x00\xff" * 100, "an answer that is not AWS's"),
        ]:
            h.fake.hostile["DescribeAutoScalingGroups"] = (status, body)
            with pytest.raises(ProviderUnavailable):
                await provider.list_instances()
            assert h.kinds()[-1] == "ProviderError" and said in h.events[-1][1]["message"], h.events[-1]
        del h.fake.hostile["DescribeAutoScalingGroups"]
        assert await provider.list_instances() == frozenset()

    run(moto_server, tmp_path, scenario)


def test_failed_launches_are_said_once_each_but_not_those_from_before(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.fake.failed_launch("Could not launch Spot Instances. InsufficientInstanceCapacity - no g5.xlarge.")
        provider = h.provider(max_capacity=3)
        h.fake.hostile["SetDesiredCapacity"] = (200, "<SetDesiredCapacityResponse/>")  # the group launches nothing
        await provider.request_capacity(2)
        await provider.list_instances()
        await settle(provider)
        await provider.list_instances()
        await settle(provider)
        assert "ProviderCapacityUnavailable" not in h.kinds(), "a failure from before this controller looked"
        h.fake.failed_launch("The image id '[ami-0123456789abcdef0]' does not exist")
        h.fake.failed_launch("Could not launch Spot Instances. UnfulfillableCapacity - try other types.")
        for _ in range(2):
            await provider.list_instances()
            await settle(provider)
        failed = [(k, d["message"]) for k, d in h.events if d.get("operation") == "launch"]
        assert [k for k, _ in failed] == ["ProviderError", "ProviderCapacityUnavailable"]
        assert "does not exist" in failed[0][1] and failed[1][1].startswith("launch failed: Could not launch Spot")

    run(moto_server, tmp_path, scenario)


def test_a_level_above_the_groups_max_size_is_capped_and_said_once(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(slots_per_instance=4)
        await provider.request_capacity(40)  # 10 instances; the group's MaxSize is 3
        await provider.list_instances()
        await settle(provider)
        await provider.request_capacity(40)
        await provider.list_instances()
        await settle(provider)
        assert len(h.fake.names()) == 3
        limited = [d for k, d in h.events if k == "ProviderCapacityLimited"]
        assert len(limited) == 1 and limited[0]["wanted"] == 10 and limited[0]["capacity"] == 3

    run(moto_server, tmp_path, scenario, max_size=3)


def test_describe_says_what_to_fix() -> None:
    def client_error(code: str, status: int, message: str = "m") -> ClientError:
        answer = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(answer, "SetDesiredCapacity")

    denied = describe(client_error("AccessDenied", 403))
    assert denied.kind == "ProviderAuthFailed" and denied.message.endswith("instance profile: docs/aws.md)")
    assert describe(client_error("Throttling", 400), 12).retry_after == 12
    assert describe(client_error("ScalingActivityInProgress", 400)).kind == "ProviderConflict"
    assert describe(NoCredentialsError()).kind == "ProviderAuthFailed"
    assert describe(EndpointConnectionError(endpoint_url="http://x")).kind == "ProviderUnreachable"
    assert describe(TimeoutError()).kind == "ProviderUnreachable"
    assert describe(ValueError("x")).kind == "ProviderError"
    assert describe(client_error("Weird", 200, "\n".join(["x"] * 1000))).message.count("x") <= 300
