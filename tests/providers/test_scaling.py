"""What every cloud provider decides alike (controller.providers.scaling): backoff, capacity, the busy-node rule,
the token bookkeeping; pure functions, no SDK, no clock but the numbers passed in."""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.events import EventKind
from controller.providers import scaling as scale
from controller.providers.scaling import Backoff, Failure

NOW = 1000.0


def test_capacity_errors_double_the_backoff_up_to_the_cap_and_success_resets_it() -> None:
    failure = Failure(scale.CAPACITY_UNAVAILABLE, "AllocationFailed")
    first = scale.after_failure(Backoff(), failure, NOW, 30, 100)
    assert (first.seconds, first.not_before) == (30, NOW + 30)
    assert scale.after_failure(first, failure, NOW, 30, 100).seconds == 60
    assert scale.after_failure(Backoff(seconds=60), failure, NOW, 30, 100).seconds == 100
    assert scale.after_success(first) == Backoff(not_before=NOW + 30)
    assert first.retry_at(NOW) == NOW + 30 and first.retry_at(NOW + 31) is None


def test_throttling_waits_for_retry_after_and_blocks_reads_too() -> None:
    throttled = scale.after_failure(Backoff(), Failure(scale.THROTTLED, "429", 40), NOW, 30, 100)
    assert throttled == Backoff(throttled_until=NOW + 40)
    assert not throttled.may_read(NOW + 39) and throttled.may_read(NOW + 40)
    without_header = scale.after_failure(Backoff(), Failure(scale.THROTTLED, "429"), NOW, 30, 100)
    assert without_header.throttled_until == NOW + scale.DEFAULT_RETRY_AFTER_SECONDS
    assert scale.after_failure(Backoff(), Failure(EventKind.PROVIDER_CONFLICT, "409"), NOW, 30, 100) == Backoff()


def test_desired_capacity_is_the_target_raised_to_the_ask_within_the_max() -> None:
    assert scale.desired_capacity(2, None, 7) == 2  # no max: the set never grows on demand
    assert scale.desired_capacity(2, 5, 4) == 4
    assert scale.desired_capacity(2, 5, 9) == 5
    assert scale.desired_capacity(2, 5, 0) == 2  # nobody asks: the floor stays


def test_release_never_deletes_a_busy_node_without_the_operator() -> None:
    assert not scale.may_delete(True, delete_busy=False, force=False)
    assert scale.may_delete(True, delete_busy=True, force=False)
    assert scale.may_delete(True, delete_busy=False, force=True)
    assert scale.may_delete(False, delete_busy=False, force=False)


@dataclass(frozen=True)
class Vm:
    name: str
    running: bool = True


def test_a_token_is_needed_by_a_running_instance_not_handed_one_not_under_way_not_waiting() -> None:
    listed = [Vm("a"), Vm("b"), Vm("c"), Vm("d"), Vm("e", running=False)]
    pending = {scale.token_key("c"), scale.SCALE}
    needing = scale.needing_token(listed, lambda v: v.name, {"b"}, {"d": NOW + 1}, pending, NOW)
    assert [v.name for v in needing] == ["a"]
    assert [v.name for v in scale.needing_token(listed, lambda v: v.name, {"b"}, {"d": NOW}, pending, NOW)] == [
        "a",
        "d",
    ]
