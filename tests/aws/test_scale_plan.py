"""The AWS provider's decisions without boto3: the group read from hostile answers, the plan, the errors."""

from __future__ import annotations

from typing import Any

import pytest

from controller.core.events import EventKind
from controller.providers import scaling
from controller.providers.aws_scale import (
    Group,
    Instance,
    MalformedResponse,
    desired_capacity,
    failure_kind,
    launch_failures,
    parse_group,
    plan_scale,
)
from controller.providers.scaling import Backoff

K = EventKind


def group(desired: int, *lifecycles: str, min_size: int = 0, max_size: int = 10) -> Group:
    instances = tuple(Instance(f"i-{n:017x}", state) for n, state in enumerate(lifecycles))
    return Group("spot", desired, min_size, max_size, instances)


def plan(g: Group, desired: int, busy: frozenset[str] = frozenset(), **kwargs: Any) -> Any:
    values: dict[str, Any] = {"delete_busy": False, "pending": (), "now": 0.0, "backoff": Backoff()}
    return plan_scale(g, desired, busy, **{**values, **kwargs})


def document(**group: Any) -> dict[str, Any]:
    base = {"AutoScalingGroupName": "spot", "DesiredCapacity": 1, "MinSize": 0, "MaxSize": 4}
    instance = {"InstanceId": "i-0123456789abcdef0", "LifecycleState": "InService", "HealthStatus": "Healthy"}
    return {"AutoScalingGroups": [{**base, "Instances": [instance], **group}]}


def test_the_group_is_read_and_only_living_instances_count() -> None:
    found = parse_group(document(), "spot")
    assert found is not None and found.desired == 1 and found.instances[0].running
    assert parse_group({"AutoScalingGroups": []}, "spot") is None
    states = ("Pending", "InService", "Terminating", "Terminated", "Detached", "Standby", "Warmed:Running")
    assert [i.lifecycle for i in group(0, *states).alive] == ["Pending", "InService", "Standby"]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("<html>", "expected an object"),
        ({}, "AutoScalingGroups is missing"),
        ({"AutoScalingGroups": "x"}, "not list"),
        (document(DesiredCapacity="3"), "DesiredCapacity is str"),
        (document(DesiredCapacity=True), "DesiredCapacity is bool"),
        (document(MaxSize=10**9), "out of range"),
        (document(Instances=[{"InstanceId": "../etc/passwd", "LifecycleState": "InService"}]), "not an EC2 instance"),
        (document(Instances=[{"InstanceId": "i-0123456789abcdef0"}]), "LifecycleState is missing"),
        (document(Instances=[None]), "expected an object"),
    ],
)
def test_a_malformed_answer_is_refused_with_what_is_wrong(answer: Any, said: str) -> None:
    with pytest.raises(MalformedResponse, match=said):
        parse_group(answer, "spot")


def test_the_desired_capacity_is_the_level_within_floor_ceiling_and_the_groups_sizes() -> None:
    g = group(0, min_size=1, max_size=6)
    assert desired_capacity(0, None, g, 0) == 1  # the group's MinSize
    assert desired_capacity(2, None, g, 0) == 2  # the provider's floor
    assert desired_capacity(0, 4, g, 9) == 4  # its ceiling
    assert desired_capacity(0, None, g, 9) == 6  # the group's MaxSize
    assert desired_capacity(0, 10, g, 9) == 6


def test_up_raises_the_desired_capacity_and_nothing_else() -> None:
    assert plan(group(1, "InService"), 3).set_desired == 3
    assert plan(group(3, "InService"), 3).set_desired is None  # launching already
    assert plan(group(1, "InService"), 3, pending={"scale"}).set_desired is None  # one operation at a time
    throttled = Backoff(throttled_until=10.0)
    assert plan(group(1, "InService"), 3, backoff=throttled).set_desired is None


def test_down_terminates_idle_instances_booting_ones_first_never_a_busy_one() -> None:
    g = group(4, "InService", "InService", "Pending", "InService")
    ids = [i.id for i in g.instances]
    down = plan(g, 1, frozenset({ids[0], ids[3]}))
    assert [i.id for i in down.terminate] == [ids[2], ids[1]] and down.deferred == 1
    assert down.set_desired is None  # already the instances there are: each termination decrements it
    everyone = plan(g, 1, frozenset(ids), delete_busy=True)
    assert len(everyone.terminate) == 3 and everyone.deferred == 0


def test_down_meets_the_instances_first_so_the_group_picks_none_itself() -> None:
    launching = group(5, "InService", "InService")  # 3 launches the group could not make
    assert plan(launching, 1).set_desired == 2 and len(plan(launching, 1).terminate) == 1
    assert plan(launching, 2).set_desired == 2 and plan(launching, 2).terminate == ()
    below = group(1, "InService", "InService", "InService")  # protected instances above a lowered capacity
    assert plan(below, 1).set_desired == 3 and len(plan(below, 1).terminate) == 2
    busy = frozenset(i.id for i in below.instances)
    kept = plan(below, 1, busy)  # nothing to terminate: never raised above what the controller asked
    assert kept.set_desired is None and kept.deferred == 2


def needing_token(
    alive: tuple[Instance, ...], delivered: set[str], retry_at: dict[str, float], pending: tuple[str, ...], now: float
) -> list[Instance]:
    return scaling.needing_token(alive, lambda i: i.id, delivered, retry_at, pending, now)


def test_tokens_go_to_instances_in_service_once_and_retry_on_their_own_clock() -> None:
    g = group(3, "InService", "Pending", "InService")
    a, _, c = (i.id for i in g.instances)
    assert [i.id for i in needing_token(g.alive, set(), {}, (), 0.0)] == [a, c]
    assert needing_token(g.alive, {a}, {c: 60.0}, (), 0.0) == []
    assert needing_token(g.alive, {a}, {}, (f"token:{c}",), 0.0) == []


def test_errors_are_events_an_operator_can_act_on() -> None:
    assert failure_kind("Throttling", 400, "Rate exceeded") == K.PROVIDER_THROTTLED
    assert failure_kind("ThrottlingException", 400, "") == K.PROVIDER_THROTTLED
    assert failure_kind(None, 429, "") == K.PROVIDER_THROTTLED
    assert failure_kind("AccessDenied", 403, "") == K.PROVIDER_AUTH_FAILED
    assert failure_kind("ScalingActivityInProgress", 400, "") == K.PROVIDER_CONFLICT
    assert failure_kind("ValidationError", 400, "AutoScalingGroup name not found") == K.PROVIDER_NOT_FOUND
    assert failure_kind("InsufficientInstanceCapacity", 500, "") == K.PROVIDER_CAPACITY_UNAVAILABLE
    assert failure_kind("InternalFailure", 500, "") == K.PROVIDER_ERROR


def test_failed_launches_are_read_once_each() -> None:
    activity = {"ActivityId": "a1", "StatusCode": "Failed", "Description": "Launching", "StatusMessage": "no  Spot"}
    answer = {"Activities": [activity, {**activity, "ActivityId": "a2", "StatusCode": "Successful"}]}
    assert launch_failures(answer, set()) == [("a1", "no Spot")]
    assert launch_failures(answer, {"a1"}) == []
    with pytest.raises(MalformedResponse):
        launch_failures({"Activities": [{"ActivityId": 3}]}, set())
