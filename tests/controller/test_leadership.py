"""The lease's pure decisions (controller.core.leadership): who may take it, when a holder must step down, and the
controller's role table walked whole."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.leadership import (
    ROLE_TRANSITIONS,
    ControllerRole,
    IllegalRoleChange,
    Lease,
    RoleCause,
    change_role,
    claim,
    renewed,
    step_down_at,
)

HOLDERS = st.sampled_from(["a#1", "b#2", "c#3"])
TIMES = st.floats(min_value=0, max_value=1e6, allow_nan=False)


def test_a_missing_lease_is_taken_at_epoch_one() -> None:
    assert claim(None, "a#1", "a:1", 100.0, 6.0, force=False) == Lease("a#1", "a:1", 1, 106.0)


def test_a_live_lease_of_another_is_not_taken_until_it_runs_out() -> None:
    held = Lease("a#1", "a:1", 4, 106.0)
    assert claim(held, "b#2", "b:1", 105.9, 6.0, force=False) is None
    assert claim(held, "b#2", "b:1", 106.0, 6.0, force=False) == Lease("b#2", "b:1", 5, 112.0)


def test_sqlite_forces_a_live_lease_left_by_a_dead_process_of_its_directory() -> None:
    held = Lease("a#1", "a:1", 4, 106.0)
    assert claim(held, "a#9", "a:1", 100.0, 6.0, force=True) == Lease("a#9", "a:1", 5, 106.0)


def test_a_released_lease_is_taken_at_once() -> None:
    released = Lease("a#1", "a:1", 2, 0.0)
    assert claim(released, "b#2", "b:1", 50.0, 6.0, force=False) == Lease("b#2", "b:1", 3, 56.0)


@given(
    st.lists(st.tuples(HOLDERS, TIMES), min_size=1, max_size=30),
)
def test_two_holders_never_hold_a_live_lease_at_once_and_epochs_only_grow(attempts: list[tuple[str, float]]) -> None:
    lease: Lease | None = None
    for holder, now in sorted(attempts, key=lambda a: a[1]):  # the database's clock only moves forward
        taken = claim(lease, holder, holder, now, 6.0, force=False)
        if taken is None:
            assert lease is not None and lease.live(now) and lease.holder != holder
            continue
        if lease is not None:
            assert taken.epoch == lease.epoch + (taken.holder != lease.holder)
            assert taken.holder == lease.holder or not lease.live(now), "took a live lease of another"
        lease = taken


def test_a_renewal_by_a_deposed_holder_is_refused() -> None:
    mine = Lease("a#1", "a:1", 3, 106.0)
    assert renewed(Lease("a#1", "a:1", 3, 106.0), mine, 104.0, 6.0) == Lease("a#1", "a:1", 3, 110.0)
    assert renewed(Lease("b#2", "b:1", 4, 112.0), mine, 104.0, 6.0) is None
    assert renewed(None, mine, 104.0, 6.0) is None


@given(st.floats(0, 1e6), st.floats(1, 300), st.floats(0, 1e3))
def test_a_holder_steps_down_before_the_database_can_expire_its_lease(
    asked: float, seconds: float, late: float
) -> None:
    """The database dates a renewal no earlier than the holder asked for it (``late`` >= 0)."""
    expires_in_database = asked + late + seconds
    assert step_down_at(asked, seconds, seconds / 3) < expires_in_database


def test_every_role_change_in_the_table_is_allowed_for_its_causes_and_no_other() -> None:
    for (source, target), causes in ROLE_TRANSITIONS.items():
        for cause in RoleCause:
            if cause in causes:
                assert change_role(source, target, cause, 1.0, 2).target is target
            else:
                with pytest.raises(IllegalRoleChange):
                    change_role(source, target, cause, 1.0, 2)
    for source in ControllerRole:
        for target in ControllerRole:
            if (source, target) not in ROLE_TRANSITIONS:
                with pytest.raises(IllegalRoleChange):
                    change_role(source, target, RoleCause.LEASE_TAKEN, 1.0, 1)


def test_every_role_is_reachable_and_a_stopped_controller_stays_stopped() -> None:
    reached, frontier = {ControllerRole.STARTING}, [ControllerRole.STARTING]
    while frontier:
        source = frontier.pop()
        for s, t in ROLE_TRANSITIONS:
            if s is source and t not in reached:
                reached.add(t)
                frontier.append(t)
    assert reached == set(ControllerRole)
    assert not [edge for edge in ROLE_TRANSITIONS if edge[0] is ControllerRole.STOPPED]
