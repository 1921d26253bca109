"""The one rule for refused reports: the agent fits what it sends to the controller's own bounds, withholds
what the controller refuses anyway, and never stops beating for a measurement."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.api import reports as controller_checks
from morphing.validation import MAX_LOSS
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.agent.test_transport import FakeAgentStub, failure
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.agent.daemon import Agent, AgentConfig
from worker_agent.agent.progress import Held, TrainerReport
from worker_agent.agent.refusals import Measurement, Withheld, after_refusal, fit, prepare
from worker_agent.agent.transport import ControllerLink, Endpoint
from worker_agent.agent.wire import Registration, trainer_status_to_pb

KEY = TrainerKey("job-1", 2, 0)


def report(**fields: Any) -> TrainerReport:
    return TrainerReport(TrainerStatus(KEY, True, None), pid=100, step=fields.pop("step", 10), **fields)


def accepted_by_the_controller(sent: TrainerReport) -> None:
    """The controller's own checks of a trainer's measurements (those that need no job) pass."""
    status = trainer_status_to_pb(sent)
    controller_checks.evaluation("t", status)
    controller_checks.training("t", status)
    controller_checks.checkpoint_stall("t", status)
    controller_checks.step_times("t", status)
    assert status.last_checkpoint_step <= status.last_step
    assert not status.HasField("held_step") or status.last_step <= status.held_step <= status.last_step + 1


def test_an_absurd_eval_loss_is_left_out_and_said() -> None:
    sent, changes = fit(report(eval_step=10, eval_loss=3e31))
    assert (sent.eval_loss, sent.eval_step) == (None, 0)
    assert [c.measurement for c in changes] == [Measurement.EVALUATION]
    assert "eval_loss 3e+31 left out" in str(changes[0]) and "job-1 generation 2 rank 0" in str(changes[0])
    accepted_by_the_controller(sent)


def test_an_absurd_training_loss_or_rate_is_left_out_and_said() -> None:
    sent, changes = fit(report(loss=float("nan"), samples_per_second=12.0))
    assert (sent.loss, sent.samples_per_second) == (None, None)
    assert [c.measurement for c in changes] == [Measurement.TRAINING] and "loss nan" in changes[0].why
    kept, none = fit(report(loss=2.5, samples_per_second=12.0))
    assert (kept.loss, kept.samples_per_second, none) == (2.5, 12.0, ())
    status = trainer_status_to_pb(kept)
    assert (status.loss, status.samples_per_second) == (2.5, 12.0)


def test_a_clock_that_stepped_back_clamps_the_first_step_time() -> None:
    """Before: the controller refused ``first_step_at ... needs a last_step_at at or after it`` and the agent died."""
    original = report(first_step_at=2_000_000_000.0, last_step_at=1_999_999_000.0)
    with pytest.raises(ValueError, match="first_step_at"):
        controller_checks.step_times("t", trainer_status_to_pb(original))
    sent, changes = fit(original)
    assert sent.first_step_at == sent.last_step_at == 1_999_999_000.0
    assert "clock stepped back" in changes[0].why
    accepted_by_the_controller(sent)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"first_step_at": 10.0, "last_step_at": 20.0, "first_step_seconds": -0.5}, "first step's -0.5 s left out"),
        ({"first_step_at": 10.0, "last_step_at": 20.0, "first_step_seconds": float("nan")}, "first step's nan s"),
        ({"first_step_at": 10.0, "last_step_at": 20.0, "first_step_seconds": 1e9}, "first step's 1000000000.0 s"),
        ({"last_step_at": 20.0, "first_step_seconds": 2.0}, "within a first_step_at"),  # a length without its step
        ({"first_step_at": 1.0, "last_step_at": 20.0, "first_step_seconds": 1.5}, "within"),  # begun before 1970
    ],
)
def test_an_absurd_first_step_length_is_left_out_and_said(fields: dict[str, Any], why: str) -> None:
    original = report(**fields)
    with pytest.raises(ValueError, match="first_step_seconds"):
        controller_checks.step_times("t", trainer_status_to_pb(original))
    sent, changes = fit(original)
    assert sent.first_step_seconds is None and sent.last_step_at == 20.0
    assert [c.measurement for c in changes] == [Measurement.STEP_TIMES] and why in changes[0].why
    accepted_by_the_controller(sent)


def test_a_report_within_bounds_is_sent_unchanged() -> None:
    within = report(eval_step=10, eval_loss=-MAX_LOSS, first_step_at=1.0, last_step_at=2.0, stall_seconds=0.5)
    assert fit(within) == (within, ())


floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e30, -1e30, 1e31, 0.0, 1e11, 1e11 + 1])


@given(
    step=st.integers(0, 10**6),
    eval_loss=st.none() | floats,
    first=st.none() | floats,
    took=st.none() | floats,
    last=st.none() | floats,
    stall=st.none() | floats,
    held=st.none() | st.integers(0, 10**6 + 5),
    checkpoint=st.none() | st.integers(0, 10**6 + 5),
    loss=st.none() | floats,
    rate=st.none() | floats,
)
def test_whatever_the_trainer_measured_the_controller_accepts_what_the_agent_sends(
    step: int,
    eval_loss: float | None,
    first: float | None,
    took: float | None,
    last: float | None,
    stall: float | None,
    held: int | None,
    checkpoint: int | None,
    loss: float | None,
    rate: float | None,
) -> None:
    measured = report(
        loss=loss,
        samples_per_second=rate,
        step=step,
        eval_step=step if eval_loss is not None else 0,
        eval_loss=eval_loss,
        first_step_at=first,
        first_step_seconds=took,
        last_step_at=last,
        stall_step=step if stall is not None else 0,
        stall_seconds=stall,
        held=Held(0, 0, held) if held is not None else None,
        last_checkpoint_step=checkpoint,
    )
    sent, _ = prepare([measured], Withheld())
    accepted_by_the_controller(sent[0])


def test_a_refusal_naming_a_field_withholds_that_measurement_of_that_trainer() -> None:
    other = TrainerReport(TrainerStatus(TrainerKey("job-1", 2, 1), True, None), pid=101, step=10)
    sent = [other, report(eval_step=10, eval_loss=1.0)]
    withheld, line = after_refusal("trainers[1].eval_loss: a newer bound", sent, Withheld())
    assert withheld.of(KEY) == {Measurement.EVALUATION} and withheld.of(other.status.key) == set()
    assert "eval_loss of job-1 generation 2 rank 0" in line and "withheld from now on" in line
    again, _ = prepare(sent, withheld)
    assert again[1].eval_loss is None and again[1].step == 10


def test_a_refusal_naming_no_measurement_withholds_every_one_then_leaves_it_to_the_lease() -> None:
    sent = [report(eval_step=10, eval_loss=1.0, error="boom")]
    bare, line = after_refusal("trainers[0].rank: generation 2 placed no rank 0 on node-1", sent, Withheld())
    assert bare.of(KEY) == set(Measurement), line
    stripped, _ = prepare(sent, bare)
    assert (stripped[0].eval_loss, stripped[0].error, stripped[0].step) == (None, "", 10)
    unchanged, line = after_refusal("trainers[0].rank: still", stripped, bare)
    assert unchanged == bare and "until the lease decides" in line


def test_a_refused_heartbeat_never_stops_the_agent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``CallRefused`` left the loop, the agent exited, the node went LOST and the next node took the
    job and died the same way. Now the agent withholds what was refused and beats again."""
    refused = failure(grpc.StatusCode.INVALID_ARGUMENT, "trainers[0].eval_loss: 3e+31 is not a finite number")
    stub = FakeAgentStub(refused, refused, pb.HeartbeatResponse(heartbeat_interval_seconds=1.0))
    agent = Agent(AgentConfig(("fake:1",), "t", tmp_path / "agent"))
    agent.link = ControllerLink(Endpoint(("fake:1",)), stub=stub)
    agent.state.node = Registration("node-1", 1, "node-token", 1.0, 10.0)

    async def beats() -> None:
        for _ in range(3):
            await agent._beat()

    with caplog.at_level(logging.ERROR, logger="spotmorph.agent"):
        asyncio.run(beats())
    assert [method for method, _, _ in stub.calls] == ["Heartbeat"] * 3
    assert "heartbeat refused (INVALID_ARGUMENT)" in caplog.text
