"""Issue 24: the training loss and samples/s reach the user: the newest step's on the job (status, metrics,
the wire), and the event log at a bounded rate (pure core, fake clock); bad values are refused as input."""

from __future__ import annotations

import math

import grpc
import pytest

from controller.client.commands.status import loss_of, sparkline, watch_view
from controller.core.events import EventKind
from controller.persistence.codec import job_from_dict, job_to_dict
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.helpers import from_old_row, version_9_row
from tests.controller.test_eval_and_pause import beat_all, events
from tests.controller.test_hostile_edge import refusal, running_job
from tests.controller.test_reconcile import Sim, started


def beats(sim: Sim, seconds: float, step: int, loss: float, samples_per_second: float | None = None) -> None:
    """``seconds`` of heartbeats every 5 s (within the expiry), each reporting ``step`` and its loss."""
    for _ in range(int(seconds // 5)):
        beat_all(sim, step, loss=loss, samples_per_second=samples_per_second)
        sim.step(5)


def test_the_newest_loss_reaches_the_job_and_the_log_at_most_once_a_period() -> None:
    sim = started(2)  # CONFIG's progress_event_seconds: 60
    beat_all(sim, 10, loss=3.5, samples_per_second=120.0)
    sim.step(1)
    training = sim.job().training
    assert (training.loss, training.step, training.samples_per_second) == (3.5, 10, 120.0)
    beats(sim, 30, 20, loss=3.0, samples_per_second=125.0)  # within the period: kept on the job, not logged
    assert (sim.job().training.loss, sim.job().training.step) == (3.0, 20)
    beats(sim, 30, 30, loss=2.5, samples_per_second=130.0)  # still within it
    beats(sim, 10, 40, loss=2.0, samples_per_second=140.0)  # past it: the newest step is logged
    logged = [
        (e.data["step"], e.data["loss"], e.data["samples_per_second"])
        for e in events(sim, EventKind.TRAINING_PROGRESSED)
    ]
    assert logged == [(10, 3.5, 120.0), (40, 2.0, 140.0)]
    beats(sim, 70, 25, loss=9.0)  # an older step never replaces a newer one
    assert (sim.job().training.loss, sim.job().training.step) == (2.0, 40)
    assert job_from_dict(job_to_dict(sim.job())) == sim.job()  # kept across a controller restart


def test_a_record_written_before_losses_were_kept_loads_with_none() -> None:
    sim = started(1)
    old = version_9_row(sim.job())
    del old["training"]
    assert from_old_row(old).training.loss is None  # schema 9 completes older rows


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"loss": math.nan}, "loss"),
        ({"loss": 1e31}, "loss"),
        ({"samples_per_second": -1.0}, "samples_per_second"),
        ({"samples_per_second": math.inf}, "samples_per_second"),
    ],
)
def test_a_loss_or_rate_out_of_range_is_invalid_argument_naming_it(
    live: Live, fields: dict[str, float], named: str
) -> None:
    node, job_id, generation = running_job(live, steps=100)
    status = pb.TrainerStatus(job=job_id, generation=generation, rank=0, running=True, last_step=3)
    for name, value in fields.items():
        setattr(status, name, value)
    code, detail = refusal(lambda: node.beat(status))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"trainers[0].{named}" in detail
    node.beat(pb.TrainerStatus(job=job_id, generation=generation, rank=0, running=True, last_step=3, loss=2.0))
    job = live.jobs().GetJob(pb.GetJobRequest(id=job_id))
    assert (job.loss, job.loss_step) == (2.0, 3)
    assert "spotmorph_job_loss{job=" in live.scrape()


def test_a_loss_before_any_step_is_refused(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100)
    status = pb.TrainerStatus(job=job_id, generation=generation, rank=0, running=True, last_step=0, loss=2.0)
    code, detail = refusal(lambda: node.beat(status))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "trainers[0].loss" in detail and "last_step >= 1" in detail


def test_the_watch_view_draws_the_loss_so_far() -> None:
    assert sparkline([4.0, 3.0, 2.0, 1.0]) == "█▆▃▁"
    assert sparkline([2.0, 2.0]) == "▁▁" and sparkline([]) == ""
    job = {
        "id": "job-1", "name": "demo", "state": "RUNNING", "step": 30, "total_steps": 100, "generation": 2,
        "layout": None, "last_checkpoint_step": 20, "steps_lost": 0, "reason": "", "loss": 2.5, "loss_step": 30,
        "samples_per_second": 130.0,
    }  # fmt: skip
    view = watch_view(job, None, 0.0, losses=[3.5, 3.0])
    assert "loss 2.5000 at step 30, 130.0 samples/s" in view and "█▅▁ (2.5000 .. 3.5000)" in view
    assert loss_of('{"generation": 1, "step": 4, "loss": 2.0, "samples_per_second": null}') == 2.0
    assert loss_of("not json") is None and loss_of('{"loss": "x"}') is None
