"""Evaluation losses and morph pauses through a real controller: agent wire in, status, metrics, events out.

Hostile values in the new TrainerStatus fields are refused with INVALID_ARGUMENT naming the field, and
change nothing; good ones reach ``GetJob`` (what ``spotmorph status`` shows), ``/metrics`` and the log.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from typing import Any, Literal

import pytest

from controller.api import wire
from controller.client.commands.common import job_dict
from controller.client.commands.status import morph_line
from morphing.transfer import HeldSkipCause
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.test_hostile_edge import INVALID, Node, refusal, running_job, wait_for
from tests.controller.test_metrics import parse
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.refusals import fit
from worker_agent.agent.wire import trainer_status_to_pb


def status(job_id: str, generation: int, rank: int = 0, last_step: int = 10, **fields: Any) -> pb.TrainerStatus:
    return pb.TrainerStatus(job=job_id, generation=generation, rank=rank, running=True, last_step=last_step, **fields)


def job_of(live: Live, job_id: str) -> pb.Job:
    return live.jobs().GetJob(pb.GetJobRequest(id=job_id))


def event_data(live: Live, kind: str) -> list[dict[str, Any]]:
    found = live.jobs().WatchEvents(pb.WatchEventsRequest(), timeout=5)
    return [json.loads(e.data_json) for e in found if e.kind == kind]


def test_the_agent_wire_carries_evaluation_and_step_times_into_a_rank_report() -> None:
    report = TrainerReport(
        TrainerStatus(TrainerKey("job-1", 2, 1), True),
        pid=7,
        step=12,
        eval_step=10,
        eval_loss=2.125,
        first_step_at=1_700_000_001.25,
        first_step_seconds=0.75,
        last_step_at=1_700_000_009.5,
    )
    message = pb.TrainerStatus.FromString(trainer_status_to_pb(report).SerializeToString())
    rank = wire.rank_from_pb(message, "")
    assert (rank.eval_step, rank.eval_loss) == (10, 2.125)
    assert (rank.first_step_at, rank.first_step_seconds, rank.last_step_at) == (1_700_000_001.25, 0.75, 1_700_000_009.5)
    skipped = replace(report, held_skipped="a peer went silent", held_skipped_cause="peer_timeout")
    said = wire.rank_from_pb(pb.TrainerStatus.FromString(trainer_status_to_pb(skipped).SerializeToString()), "")
    assert said.held_skipped_cause is HeldSkipCause.PEER_TIMEOUT
    bare = wire.rank_from_pb(trainer_status_to_pb(TrainerReport(report.status, pid=7)), "")
    assert (bare.eval_step, bare.eval_loss, bare.first_step_at, bare.last_step_at) == (0, None, None, None)
    assert bare.first_step_seconds is None
    assert bare.held_skipped_cause is None
    measured = TrainerReport(report.status, pid=7, step=12, eval_step=10, eval_loss=math.nan)
    diverged = trainer_status_to_pb(fit(measured)[0])  # the agent fits every report to the bounds before sending
    assert not diverged.HasField("eval_loss") and diverged.eval_step == 0  # never a value the controller refuses


HOSTILE = [
    ({"eval_step": 5, "eval_loss": math.nan}, "eval_loss"),
    ({"eval_step": 5, "eval_loss": math.inf}, "eval_loss"),
    ({"eval_step": 5, "eval_loss": 1e300}, "eval_loss"),
    ({"eval_step": 11, "eval_loss": 1.0}, "eval_step"),  # after the rank's last step
    ({"eval_step": 0, "eval_loss": 1.0}, "eval_loss"),  # a loss without its step
    ({"eval_step": 4}, "eval_loss"),  # a step without its loss
    ({"first_step_at": math.nan, "last_step_at": 100.0}, "first_step_at"),
    ({"last_step_at": -1.0}, "last_step_at"),
    ({"last_step_at": 1e300}, "last_step_at"),
    ({"first_step_at": 200.0, "last_step_at": 100.0}, "first_step_at"),  # the first step after the newest
    # Later than the controller's clock by more than its allowed skew (one such time once stuck to the job).
    ({"first_step_at": 100.0, "last_step_at": 1e11}, "last_step_at"),
    ({"first_step_at": time.time() + 3600, "last_step_at": time.time() + 3600}, "first_step_at"),
    ({"first_step_at": 100.0}, "first_step_at"),  # a first step without a newest one
    ({"first_step_at": 100.0, "last_step_at": 100.0, "first_step_seconds": -1.0}, "first_step_seconds"),
    ({"first_step_at": 100.0, "last_step_at": 100.0, "first_step_seconds": math.inf}, "first_step_seconds"),
    ({"first_step_at": 100.0, "last_step_at": 100.0, "first_step_seconds": 1e7}, "first_step_seconds"),  # > a week
    ({"first_step_at": 100.0, "last_step_at": 100.0, "first_step_seconds": 100.5}, "first_step_seconds"),  # before 1970
    ({"last_step_at": 100.0, "first_step_seconds": 1.0}, "first_step_seconds"),  # a length without its first step
    ({"held_skipped": "why", "held_skipped_cause": "gremlins"}, "held_skipped_cause"),  # not a HeldSkipCause
    ({"held_skipped_cause": "peer_lost"}, "held_skipped_cause"),  # a class without its words
]


def assert_refused_and_nothing_changed(
    live: Live, fields: dict[str, Any], named: str, unset: Literal["eval_loss", "checkpoint_stall_seconds"]
) -> None:
    """A heartbeat whose trainer status carries ``fields`` is INVALID_ARGUMENT naming ``named``; the job's
    ``unset`` field and its step stay as they were, and the node's next good heartbeat still counts."""
    node, job_id, generation = running_job(live, steps=100)
    code, detail = refusal(lambda: node.beat(status(job_id, generation, **fields)))
    assert code == INVALID and f"trainers[0].{named}" in detail, detail
    job = job_of(live, job_id)
    assert not job.HasField(unset) and job.step == 0
    node.beat(status(job_id, generation))  # the node is still heard
    wait_for(lambda: job_of(live, job_id).step == 10, "the good report to count")


@pytest.mark.parametrize(("fields", "named"), HOSTILE)
def test_hostile_evaluations_and_step_times_are_refused_and_change_nothing(
    live: Live, fields: dict[str, Any], named: str
) -> None:
    assert_refused_and_nothing_changed(live, fields, named, unset="eval_loss")


def test_an_evaluation_reaches_status_metrics_and_the_event_log(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100)
    node.beat(status(job_id, generation, last_step=20, eval_step=20, eval_loss=1.8125))
    wait_for(lambda: job_of(live, job_id).eval_step == 20, "the evaluation to reach the job")
    shown = job_dict(job_of(live, job_id))
    assert (shown["eval_loss"], shown["eval_step"]) == (1.8125, 20)
    samples = parse(live.scrape())
    assert samples["spotmorph_job_eval_loss"][(("job", job_id),)] == 1.8125
    assert samples["spotmorph_job_eval_step"][(("job", job_id),)] == 20
    assert event_data(live, "EvaluationCompleted") == [{"generation": generation, "step": 20, "loss": 1.8125}]
    untouched = job_dict(job_of(live, running_job(live, checkpoint_dir=str(live.state_dir / "c2"))[1]))
    assert (untouched["eval_loss"], untouched["eval_step"]) == (None, None)


def evicted_and_stopped(live: Live, hand_off_failed: str = "") -> tuple[str, int, Node]:
    """A job whose only node is evicted: its ranks stop at step 31 (saying ``hand_off_failed``) and the next
    generation is issued to a spare node, returned with the job and the stopped generation."""
    node, job_id, generation = running_job(live, steps=100)
    ranks = list(node.beat().assignment.ranks)
    before = [status(job_id, generation, r, 30, first_step_at=1000.0, last_step_at=1030.0) for r in ranks]
    node.beat(*before)
    node.beat(*before, eviction=pb.EvictionNotice(not_before=time.time() + 30, source="imds"))
    spare = Node(live, slots=2)  # arrives while the job stops: the next generation runs on it
    spare.beat()
    stopped = [
        pb.TrainerStatus(
            job=job_id,
            generation=generation,
            rank=r,
            running=False,
            exit_code=0,
            last_step=31,
            last_checkpoint_step=31,
            first_step_at=1000.0,
            last_step_at=1031.25,
            hand_off_failed=hand_off_failed,
        )
        for r in ranks
    ]
    node.beat(*stopped, eviction=pb.EvictionNotice(not_before=time.time() + 30, source="imds"))
    wait_for(lambda: job_of(live, job_id).generation == generation + 1, "the next generation")
    return job_id, generation, spare


def test_a_failed_hand_off_is_said_once_in_the_event_log(live: Live) -> None:
    _, generation, spare = evicted_and_stopped(live, "layer block0's checksum did not match\x1b[2J")
    assert event_data(live, "HandOffFailed") == [
        {"generation": generation, "step": 31, "reason": "layer block0's checksum did not match[2J"}
    ]
    spare.beat()
    spare.beat()
    assert len(event_data(live, "HandOffFailed")) == 1


def test_a_morphs_pause_reaches_status_metrics_and_the_event_log(live: Live) -> None:
    job_id, generation, spare = evicted_and_stopped(live)
    assert event_data(live, "HandOffFailed") == []
    assignment = spare.beat().assignment
    assert assignment.generation == generation + 1 and assignment.resume_step == 31
    morph = job_dict(job_of(live, job_id))["morphs"][0]
    assert morph["pause_seconds"] is None and "pause not measured yet" in morph_line(morph)
    after = [
        status(job_id, assignment.generation, r, 33, first_step_at=1036.0, first_step_seconds=3.5, last_step_at=1037.0)
        for r in assignment.ranks
    ]
    spare.beat(*after)
    wait_for(lambda: job_of(live, job_id).morphs[0].HasField("pause_seconds"), "the pause to be measured")
    morph = job_dict(job_of(live, job_id))["morphs"][0]
    assert (morph["pause_seconds"], morph["stalled_seconds"]) == (4.75, 1.25) and morph["seconds"] >= 0
    assert "training paused 4.8 s (1.2 s stalled, then the first step)" in morph_line(morph)
    assert "decided in" in morph_line(morph)
    assert morph["resumed_at_step"] == max(assignment.resume_step, assignment.held_step) == 31
    assert "morph to generation 2, resumed at step 31: training paused" in morph_line(morph)
    samples = parse(live.scrape())
    assert samples["spotmorph_morph_pause_seconds_count"][()] == 1
    assert samples["spotmorph_morph_pause_seconds_sum"][()] == 4.75
    assert samples["spotmorph_morph_stalled_seconds_sum"][()] == 1.25
    [resumed] = event_data(live, "TrainingResumed")
    assert resumed["generation"] == assignment.generation and resumed["pause_seconds"] == 4.75
    assert resumed["stalled_seconds"] == 1.25
    assert resumed["decision_seconds"] == morph["seconds"]


def test_a_held_step_past_the_jobs_last_is_refused(live: Live) -> None:
    """Before: accepted, and a salvage was ordered for step 101 of a 100-step job."""
    node, job_id, generation = running_job(live, steps=100)
    code, detail = refusal(lambda: node.beat(status(job_id, generation, last_step=100, held_step=101)))
    assert code == INVALID and "trainers[0].held_step" in detail and "last step 100" in detail, detail
