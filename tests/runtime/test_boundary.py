"""The step boundary's one decision (worker_agent/runtime/process/boundary.py), without torch.distributed.

Properties: every rank given the same agreement takes the same collective branch whatever its own facts; a
stop that every rank can hold, with a rank staying, writes nothing; fenced and lapsed end at once with nothing
written; and the decision equals the branches the step loop used to take inline (transcribed below).
"""

from __future__ import annotations

import sys

from hypothesis import given
from hypothesis import strategies as st

from worker_agent.runtime.process.boundary import Agreed, Boundary, Kind, Own, Said, Shared, Write, decide

counts = st.integers(min_value=0, max_value=4).map(float)
steps = st.integers(min_value=0, max_value=12)
maybe_step = st.none() | steps


@st.composite
def agreements(draw: st.DrawFn) -> Agreed:
    return Agreed(
        stops=draw(counts),
        loss=draw(st.floats(min_value=0, max_value=10)),
        checkpoint_request=draw(counts),
        lapsed=draw(st.sampled_from([0.0, 0.0, 0.0, 1.0])),
        fenced=draw(st.sampled_from([0.0, 0.0, 0.0, 1.0])),
        cannot_hold=draw(counts),
        leaving=draw(counts),
    )


@st.composite
def shared_facts(draw: st.DrawFn) -> Shared:
    world = draw(st.integers(min_value=1, max_value=4))
    first = draw(steps)
    return Shared(
        step=first + draw(st.integers(min_value=0, max_value=6)),
        first_step=first,
        steps=draw(st.integers(min_value=1, max_value=12)),
        eval_interval=draw(st.integers(min_value=0, max_value=4)),
        checkpoint_interval=draw(st.integers(min_value=0, max_value=4)),
        world_size=world,
        leavers=float(draw(st.integers(min_value=0, max_value=world))),
        requested=draw(st.booleans()),
        already_written=draw(maybe_step),
        durable_due=draw(maybe_step),
    )


owns = st.builds(Own, can_hold=st.booleans(), leaving=st.booleans())


@given(agreements(), shared_facts(), owns, owns)
def test_every_rank_given_the_same_agreement_takes_the_same_collective_branch(
    agreed: Agreed, shared: Shared, mine: Own, theirs: Own
) -> None:
    assert decide(agreed, shared, mine).collective == decide(agreed, shared, theirs).collective


@given(shared_facts(), owns, st.integers(min_value=1, max_value=4).map(float))
def test_a_stop_every_rank_can_hold_with_one_staying_writes_nothing(shared: Shared, own: Own, stops: float) -> None:
    plain = Shared(**{**vars(shared), "requested": False, "durable_due": None})
    if plain.step >= plain.steps or plain.leavers >= plain.world_size:
        plain = Shared(**{**vars(plain), "steps": plain.step + 1, "leavers": 0.0})
    agreed = Agreed(stops=stops, loss=1.0, checkpoint_request=0, lapsed=0, fenced=0, cannot_hold=0, leaving=0)
    boundary = decide(agreed, plain, own)
    assert boundary.kind is Kind.STOP and boundary.finishing
    assert not boundary.writes(handed_off=True), boundary
    assert boundary.hand_off == (plain.leavers > 0)
    assert boundary.writes(handed_off=False) == (boundary.hand_off and plain.step != plain.already_written)
    assert boundary.hold == (own.can_hold and not own.leaving)


@given(agreements(), shared_facts(), owns)
def test_fenced_or_lapsed_ends_at_once_with_nothing_written_or_held(agreed: Agreed, shared: Shared, own: Own) -> None:
    boundary = decide(agreed, shared, own)
    if agreed.fenced > 0:
        assert boundary == Boundary(Kind.FENCED)
    elif agreed.lapsed > 0:
        assert boundary == Boundary(Kind.LEASE_LAPSED)
    else:
        assert boundary.kind in (Kind.GO_ON, Kind.STOP, Kind.FINISH)
    if agreed.ends_at_once:
        assert boundary.ends and not boundary.finishing and not boundary.writes(False) and not boundary.hold


@given(agreements(), shared_facts(), owns)
def test_a_step_the_directory_has_is_never_written_and_a_request_always_is(
    agreed: Agreed, shared: Shared, own: Own
) -> None:
    boundary = decide(agreed, shared, own)
    if shared.step == shared.already_written:
        assert boundary.write is Write.NONE
    elif shared.requested and not agreed.ends_at_once:
        assert boundary.write is Write.NOW


def test_a_stop_one_rank_cannot_hold_writes_the_step_and_nobody_holds_beyond_its_own_say() -> None:
    shared = Shared(5, 0, 10, 0, 0, 2, 0.0, False, None, None)
    agreed = Agreed(stops=1, loss=0.5, checkpoint_request=0, lapsed=0, fenced=0, cannot_hold=1, leaving=0)
    boundary = decide(agreed, shared, Own(can_hold=True, leaving=False))
    assert boundary.kind is Kind.STOP and boundary.write is Write.NOW and not boundary.hand_off
    assert boundary.hold, "a rank that may hold keeps its stage even when the stop is written"
    assert not decide(agreed, shared, Own(can_hold=False, leaving=False)).hold


def test_the_last_step_finishes_writes_and_holds_nothing() -> None:
    shared = Shared(10, 4, 10, 5, 0, 1, 0.0, False, None, None)
    agreed = Agreed(stops=0, loss=0.5, checkpoint_request=0, lapsed=0, fenced=0, cannot_hold=0, leaving=0)
    boundary = decide(agreed, shared, Own(can_hold=True, leaving=False))
    assert boundary == Boundary(Kind.FINISH, report=True, evaluate=True, write=Write.NOW)


def test_said_fills_the_slots_in_the_agreed_order() -> None:
    said = Said(True, 0.25, 7.0, False, True, True, False)
    assert Agreed(*said.slots()) == Agreed(1.0, 0.25, 7.0, 0.0, 1.0, 1.0, 0.0)


def test_the_decision_imports_no_torch() -> None:
    import subprocess

    probe = "import sys, worker_agent.runtime.process.boundary; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def former(agreed: Agreed, shared: Shared, own: Own, handed_ok: bool) -> tuple[str, bool, bool, bool, bool, bool]:
    """The branches step_loop.run took inline before the decision was one value (transcribed, as the oracle)."""
    if agreed.fenced > 0:
        return "fenced", False, False, False, False, False
    if agreed.lapsed > 0:
        return "lapsed", False, False, False, False, False
    stopping, step = agreed.stops > 0, shared.step
    report = step > shared.first_step
    evaluate = report and shared.eval_interval > 0 and step % shared.eval_interval == 0
    finishing = stopping or step >= shared.steps
    holding = stopping and step < shared.steps and own.can_hold and not own.leaving
    in_memory = stopping and step < shared.steps and agreed.cannot_hold == 0 and shared.leavers < shared.world_size
    handing = in_memory and shared.leavers > 0
    if handing:
        in_memory = handed_ok
    interval = shared.checkpoint_interval > 0 and step % shared.checkpoint_interval == 0
    due = shared.requested or step == shared.durable_due or (not in_memory and (finishing or interval))
    written = due and step != shared.already_written
    ending = ("stopped" if stopping else "finished") if finishing else "go on"
    return ending, report, evaluate, handing, written, holding


@given(agreements(), shared_facts(), owns, st.booleans())
def test_the_decision_is_the_step_loops_former_branches(agreed: Agreed, shared: Shared, own: Own, ok: bool) -> None:
    b = decide(agreed, shared, own)
    names = {Kind.FENCED: "fenced", Kind.LEASE_LAPSED: "lapsed", Kind.STOP: "stopped", Kind.FINISH: "finished"}
    handed_ok = ok if b.hand_off else False
    got = (names.get(b.kind, "go on"), b.report, b.evaluate, b.hand_off, b.writes(handed_ok), b.hold)
    assert got == former(agreed, shared, own, handed_ok)
