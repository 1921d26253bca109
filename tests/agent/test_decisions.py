"""The agent's decisions about the controller, as pure functions: no server, no clock, no sleep."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.api.reports import MAX_WAIT_SECONDS
from morphing.errors import UserInputError
from protos.reasons import NOT_LEADER, REGISTER_AGAIN
from worker_agent.agent.converge import Action, Assignment, TrainerKey, TrainerStatus
from worker_agent.agent.decisions import (
    CheckpointCommitted,
    EpochFence,
    EvictionNotice,
    Failure,
    PeerLost,
    Pushed,
    StoppedAlone,
    TrainerExited,
    admit_epoch,
    alone_due,
    backed_off_interval,
    beat_interval,
    classify_failure,
    heartbeat_wait,
    lease_lapsed,
    lease_seconds,
    may_acknowledge,
    next_register_backoff,
    notice_deadline,
    stop_alone,
    urgent_facts,
)
from worker_agent.agent.progress import Held, TrainerReport
from worker_agent.agent.transport import CALL_TIMEOUT_SECONDS
from worker_agent.commands.agent import _lease_seconds


def report(rank: int, running: bool, code: int | None = None, checkpoint: int | None = None) -> TrainerReport:
    return TrainerReport(
        TrainerStatus(TrainerKey("j", 2, rank), running, code), pid=100 + rank, last_checkpoint_step=checkpoint
    )


def test_failures_mean_retry_register_again_or_surface() -> None:
    assert classify_failure("UNAVAILABLE", "") is Failure.RETRY
    assert classify_failure("DEADLINE_EXCEEDED", "") is Failure.RETRY
    assert classify_failure("UNKNOWN", "") is Failure.RETRY
    assert classify_failure("RESOURCE_EXHAUSTED", "") is Failure.RETRY
    assert classify_failure("NOT_FOUND", "") is Failure.REGISTER_AGAIN
    assert classify_failure("UNAUTHENTICATED", "") is Failure.REGISTER_AGAIN
    assert classify_failure("FAILED_PRECONDITION", REGISTER_AGAIN) is Failure.REGISTER_AGAIN
    # the typed word decides, never the message: one that merely says "register again" does not
    assert classify_failure("FAILED_PRECONDITION", "") is Failure.FATAL
    assert classify_failure("FAILED_PRECONDITION", "register again") is Failure.FATAL
    assert classify_failure("INVALID_ARGUMENT", "") is Failure.FATAL
    # a standby's refusal, whatever its code: never a reason to register again (the node token is good everywhere)
    assert classify_failure("FAILED_PRECONDITION", NOT_LEADER) is Failure.NOT_LEADER
    assert classify_failure("UNAUTHENTICATED", NOT_LEADER) is Failure.NOT_LEADER


def test_registration_backs_off_by_doubling_up_to_the_cap() -> None:
    waits = [0.2]
    for _ in range(8):
        waits.append(next_register_backoff(waits[-1], cap=10.0))
    assert waits[:4] == [0.2, 0.4, 0.8, 1.6] and waits[-1] == 10.0


@given(st.floats(0.05, 100), st.floats(0.1, 100), st.floats(0.3, 600))
def test_a_failing_controller_never_sees_this_node_silent_past_a_third_of_its_expiry(
    interval: float, max_backoff: float, expiry: float
) -> None:
    backed = backed_off_interval(interval, max_backoff, expiry)
    assert backed <= max(expiry / 3, 0) and backed <= max_backoff and backed <= 2 * interval


def test_the_controller_may_hold_a_beat_only_while_no_trainer_of_the_node_runs() -> None:
    """A running trainer's exit or failed collective is pushed before a beat; a held beat would delay the next."""
    assert heartbeat_wait(running=True) == 0.0
    assert 0.0 < heartbeat_wait(running=False) <= MAX_WAIT_SECONDS < CALL_TIMEOUT_SECONDS


def test_the_agent_beats_fast_only_while_its_trainers_are_asked_to_stop() -> None:
    stop, run = Assignment("j", 1, "stop", (0,)), Assignment("j", 1, "run", (0,))
    assert beat_interval(1.0, stop, healthy=True, morph_beat=0.2) == 0.2
    assert beat_interval(1.0, Assignment("j", 1, "abort"), healthy=True, morph_beat=0.2) == 0.2
    assert beat_interval(1.0, run, healthy=True, morph_beat=0.2) == 1.0
    assert beat_interval(4.0, stop, healthy=False, morph_beat=0.2) == 4.0
    assert beat_interval(1.0, None, healthy=True, morph_beat=0.2) == 1.0


def test_exits_and_checkpoints_are_pushed_once_in_report_order() -> None:
    first = [report(0, True, checkpoint=20), report(1, False, code=0)]
    facts, pushed = urgent_facts(first, Pushed())
    assert facts == [CheckpointCommitted("j", 2, 20), TrainerExited(first[1])]
    again, pushed = urgent_facts(first, pushed)
    assert again == []
    later = [report(0, False, code=0, checkpoint=25), report(1, False, code=0)]
    facts, pushed = urgent_facts(later, pushed)
    assert facts == [TrainerExited(later[0]), CheckpointCommitted("j", 2, 25)]
    assert urgent_facts([report(1, True, checkpoint=25)], pushed)[0] == [], "a step already pushed is not again"
    # a salvage's first writer commits whatever its rank
    assert urgent_facts([report(2, False, code=0, checkpoint=31)], pushed)[0][1] == CheckpointCommitted("j", 2, 31)


def test_a_failed_collective_is_pushed_once_before_the_exit() -> None:
    holding = replace(report(3, True), held=Held(stage=1, replica=1, step=40))
    facts, pushed = urgent_facts([holding], Pushed())
    assert facts == [PeerLost(holding)]
    assert urgent_facts([holding], pushed)[0] == []
    exited = replace(holding, status=TrainerStatus(TrainerKey("j", 2, 3), False, 0))
    assert urgent_facts([exited], pushed)[0] == [TrainerExited(exited)]
    assert beat_interval(1.0, Assignment("j", 2, "hold"), healthy=True, morph_beat=0.2) == 0.2


def test_eviction_is_acknowledged_once_nothing_runs_and_nothing_failed() -> None:
    notice = EvictionNotice("e-1", 1000.0)
    stopped = [report(0, False, code=0)]
    assert may_acknowledge(notice, stopped, Assignment("j", 2, "stop"))
    assert not may_acknowledge(notice, [report(0, True)], Assignment("j", 2, "stop"))
    assert not may_acknowledge(notice, [report(0, False, code=1)], Assignment("j", 2, "stop"))
    assert may_acknowledge(notice, [report(0, False, code=1)], None), "a failed trainer the controller dropped"
    assert not may_acknowledge(EvictionNotice("e-1", 1000.0, acknowledged=True), stopped, None)
    assert not may_acknowledge(None, stopped, None)


def test_a_notice_without_a_time_means_now() -> None:
    assert notice_deadline(None, now=1234.5) == 1234.5
    assert notice_deadline(2000.0, now=1234.5) == 2000.0


def test_the_lease_is_a_bound_derived_from_the_expiry_unless_set() -> None:
    assert lease_seconds(None, 10.0) == 60.0 and lease_seconds(4.0, 10.0) == 4.0
    assert not lease_lapsed(last_contact=100.0, now=160.0, lease=60.0)
    assert lease_lapsed(last_contact=100.0, now=160.5, lease=60.0)


def test_a_lease_that_is_no_number_of_seconds_is_refused() -> None:
    assert _lease_seconds(None) is None and _lease_seconds("2.5") == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(UserInputError, match="--lease-seconds"):
            _lease_seconds(bad)


def test_a_reply_older_than_the_newest_epoch_is_refused_and_said_once_per_epoch() -> None:
    fence = EpochFence()
    verdict, fence = admit_epoch(fence, 0)
    assert verdict.act and fence.newest == 0, "a controller without leases, while none had any"
    verdict, fence = admit_epoch(fence, 4)
    assert verdict.act and fence.newest == 4
    verdict, fence = admit_epoch(fence, 4)
    assert verdict.act, "the same leader again"
    verdict, fence = admit_epoch(fence, 3)
    assert (verdict.act, verdict.say, fence.newest) == (False, True, 4)
    verdict, fence = admit_epoch(fence, 3)
    assert (verdict.act, verdict.say) == (False, False), "epoch 3 was said already"
    verdict, fence = admit_epoch(fence, 0)
    assert (verdict.act, verdict.say) == (False, True), "epoch 0 once a leader gave one: an older controller"
    verdict, fence = admit_epoch(fence, 9)
    assert verdict.act and fence.newest == 9


@given(st.lists(st.integers(0, 12), max_size=40))
def test_the_newest_epoch_never_goes_back_and_only_replies_at_least_as_new_are_acted_on(epochs: list[int]) -> None:
    fence, newest, said = EpochFence(), 0, []
    for epoch in epochs:
        verdict, fence = admit_epoch(fence, epoch)
        assert verdict.act == (epoch >= newest)
        if verdict.say:
            said.append(epoch)
        newest = max(newest, epoch)
        assert fence.newest == newest
    assert len(said) == len(set(said)), "each refused epoch is logged once"
    assert set(said) == {e for i, e in enumerate(epochs) if e < max(epochs[:i], default=0)}


def test_a_notice_no_controller_heard_of_stops_the_running_generation_alone_after_a_while() -> None:
    notice = EvictionNotice("e-1", 1000.0)
    run = Assignment("j", 2, "run", (0, 1))
    training = [TrainerStatus(TrainerKey("j", 2, 0), True), TrainerStatus(TrainerKey("j", 2, 1), True)]
    assert alone_due(notice, heard=False, waited=3.0, after=3.0)
    assert not alone_due(notice, heard=False, waited=2.9, after=3.0), "a standby taking over may still hear of it"
    assert not alone_due(notice, heard=True, waited=60.0, after=3.0), "a controller heard: its order stands"
    assert not alone_due(None, heard=False, waited=60.0, after=3.0)
    assert stop_alone(notice, run, training) == StoppedAlone("e-1", "j", 2)
    asked = [TrainerStatus(k.key, True, stop_requested=True) for k in training]
    assert stop_alone(notice, run, asked) is None, "asked already: once"
    assert stop_alone(notice, run, [TrainerStatus(TrainerKey("j", 1, 0), True)]) is None, "not the assigned one"
    assert stop_alone(notice, run, [TrainerStatus(TrainerKey("j", 2, 0), False, 0)]) is None, "nothing runs"
    orders: tuple[Action, ...] = ("stop", "hold", "abort", "idle")  # the controller's own order stands
    for order in orders:
        assert stop_alone(notice, Assignment("j", 2, order, (0, 1)), training) is None, order
    assert stop_alone(notice, None, training) is None


def test_a_stop_alone_keeps_the_vm_until_a_controller_heard_of_it() -> None:
    stopped = [report(0, False, code=0)]
    assert not may_acknowledge(EvictionNotice("e-1", 1000.0), stopped, Assignment("j", 2, "run"), untold=True)
    assert may_acknowledge(EvictionNotice("e-1", 1000.0), stopped, Assignment("j", 2, "run"), untold=False)
