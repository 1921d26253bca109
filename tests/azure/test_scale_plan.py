"""The Azure scale planner as pure functions: no SDK, no server, no clock but the numbers passed in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.providers import azure_scale as scale
from controller.providers.azure_scale import Instance, ScaleOut, ScalePlan, plan_scale
from controller.providers.scaling import CLEAN, SCALE, Backoff

NOW = 1000.0
READY = Backoff()  # nothing to wait for


def running(*names: str) -> list[Instance]:
    return [Instance(name, name, "Succeeded", "running") for name in names]


def evicted(name: str, provisioning: str = "Succeeded") -> Instance:
    return Instance(name, name, provisioning, "deallocated")


def plan(
    listed: list[Instance],
    desired: int,
    busy: frozenset[str] = frozenset(),
    *,
    delete_busy: bool = False,
    pending: frozenset[str] = frozenset(),
    backoff: Backoff = READY,
) -> ScalePlan:
    return plan_scale(listed, desired, busy, delete_busy=delete_busy, pending=pending, now=NOW, backoff=backoff)


def test_at_the_desired_capacity_nothing_happens() -> None:
    assert plan(running("a", "b"), 2) == ScalePlan()


def test_below_it_scales_out_counting_evicted_instances_as_dying() -> None:
    listed = [*running("a"), evicted("b"), evicted("c", "Deleting")]
    assert plan(listed, 3) == ScalePlan(clean=(listed[1],), scale_out=ScaleOut(running=1, dying=2))


def test_above_it_deletes_idle_instances_newest_first_and_never_a_busy_one() -> None:
    listed = running("a", "b", "c", "d")
    assert plan(listed, 2).scale_in == (listed[3], listed[2])
    spared = plan(listed, 1, busy=frozenset({"d", "c", "b"}))
    assert spared.scale_in == (listed[0],) and spared.deferred == 2
    assert plan(listed, 1, busy=frozenset({"d", "c", "b"}), delete_busy=True).scale_in == tuple(reversed(listed[1:]))


def test_one_operation_of_a_kind_at_a_time() -> None:
    listed = [*running("a"), evicted("b")]
    assert plan(listed, 3, pending=frozenset({SCALE})) == ScalePlan(clean=(listed[1],))
    assert plan(listed, 3, pending=frozenset({CLEAN})) == ScalePlan(scale_out=ScaleOut(1, 1))


def test_nothing_changes_while_backing_off_or_throttled() -> None:
    assert plan(running("a"), 3, backoff=Backoff(not_before=NOW + 1)) == ScalePlan()
    assert plan(running("a"), 3, backoff=Backoff(throttled_until=NOW + 1)) == ScalePlan()
    assert plan(running("a"), 3, backoff=Backoff(not_before=NOW)).scale_out == ScaleOut(1, 0)


def test_scale_out_sets_a_capacity_only_when_it_is_not_already_asked_for() -> None:
    assert scale.capacity_to_set(current=2, desired=4, dying=1) == 5
    assert scale.capacity_to_set(current=5, desired=4, dying=1) is None


@given(
    alive=st.integers(0, 12),
    dead=st.integers(0, 4),
    desired=st.integers(0, 12),
    busy=st.sets(st.integers(0, 11)),
)
def test_plans_never_delete_busy_instances_and_reach_the_target_when_they_can(
    alive: int, dead: int, desired: int, busy: set[int]
) -> None:
    listed = running(*(f"vm{i}" for i in range(alive))) + [evicted(f"gone{i}") for i in range(dead)]
    busy_names = frozenset(f"vm{i}" for i in busy)
    result = plan(listed, desired, busy_names)
    assert not {i.name for i in result.scale_in} & busy_names
    assert len(result.clean) == dead
    if alive < desired:
        assert result.scale_out == ScaleOut(alive, dead) and not result.scale_in
    else:
        assert result.scale_out is None
        assert len(result.scale_in) + result.deferred == alive - desired
