"""A checkpoint's stall through a real controller: progress file, agent wire in, status, metrics, events out.

Hostile values in ``TrainerStatus.checkpoint_stall_*`` are refused with INVALID_ARGUMENT naming the field
and change nothing; good ones reach ``GetJob`` (what ``spotmorph status`` shows), ``/metrics`` and the log.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from controller.api import wire
from controller.client.commands.common import job_dict
from morphing.validation import MAX_STALL_SECONDS
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.test_eval_and_pause_api import assert_refused_and_nothing_changed, event_data, job_of, status
from tests.controller.test_hostile_edge import running_job, wait_for
from tests.controller.test_metrics import parse
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.agent.progress import TrainerProgress, TrainerReport, absorb
from worker_agent.agent.refusals import fit
from worker_agent.agent.wire import trainer_status_to_pb
from worker_agent.contract import CheckpointWritten, ProgressRecord, StepCompleted, progress_line, read_progress


def test_the_agent_reads_the_stall_from_the_progress_file_and_carries_it_into_a_rank_report(tmp_path: Path) -> None:
    lines = [
        ProgressRecord(StepCompleted(4, 1.0, 0.1, 80.0, None), 0, 2, 7, 1.0),
        ProgressRecord(CheckpointWritten(4, None, stall_seconds=0.03125), 0, 2, 7, 2.0),
        ProgressRecord(StepCompleted(5, 1.0, 0.1, 80.0, None), 0, 2, 7, 3.0),
        ProgressRecord(CheckpointWritten(5, 4), 0, 2, 7, 4.0),  # a line from before stalls were reported
    ]
    path = tmp_path / "progress.jsonl"
    path.write_text("".join(progress_line(r) + "\n" for r in lines))
    progress = TrainerProgress()
    for record in read_progress(path):
        progress = absorb(progress, record)
    assert (progress.stall_step, progress.stall_seconds) == (4, 0.03125)
    report = TrainerReport(
        TrainerStatus(TrainerKey("job-1", 2, 0), True),
        pid=7,
        step=progress.step,
        stall_step=progress.stall_step,
        stall_seconds=progress.stall_seconds,
    )
    message = pb.TrainerStatus.FromString(trainer_status_to_pb(report).SerializeToString())
    rank = wire.rank_from_pb(message, "")
    assert (rank.stall_step, rank.stall_seconds) == (4, 0.03125)
    bare = wire.rank_from_pb(trainer_status_to_pb(TrainerReport(report.status, pid=7)), "")
    assert (bare.stall_step, bare.stall_seconds) == (0, None)
    for broken in (math.nan, -1.0, math.inf, MAX_STALL_SECONDS * 2):  # never a value the controller refuses
        measured = TrainerReport(report.status, pid=7, step=5, stall_step=4, stall_seconds=broken)
        sent = trainer_status_to_pb(fit(measured)[0])  # the agent fits every report to the bounds before sending
        assert not sent.HasField("checkpoint_stall_seconds") and sent.checkpoint_stall_step == 0


HOSTILE = [
    ({"checkpoint_stall_step": 5, "checkpoint_stall_seconds": math.nan}, "checkpoint_stall_seconds"),
    ({"checkpoint_stall_step": 5, "checkpoint_stall_seconds": math.inf}, "checkpoint_stall_seconds"),
    ({"checkpoint_stall_step": 5, "checkpoint_stall_seconds": -math.inf}, "checkpoint_stall_seconds"),
    ({"checkpoint_stall_step": 5, "checkpoint_stall_seconds": -0.5}, "checkpoint_stall_seconds"),
    ({"checkpoint_stall_step": 5, "checkpoint_stall_seconds": 1e300}, "checkpoint_stall_seconds"),
    ({"checkpoint_stall_step": 5, "checkpoint_stall_seconds": MAX_STALL_SECONDS + 1}, "checkpoint_stall_seconds"),
    ({"checkpoint_stall_step": 11, "checkpoint_stall_seconds": 0.5}, "checkpoint_stall_step"),  # past last_step
    ({"checkpoint_stall_step": 2**63, "checkpoint_stall_seconds": 0.5}, "checkpoint_stall_step"),
    ({"checkpoint_stall_step": 4}, "checkpoint_stall_seconds"),  # a checkpoint's step without its stall
]


@pytest.mark.parametrize(("fields", "named"), HOSTILE)
def test_hostile_stalls_are_refused_naming_the_field_and_change_nothing(
    live: Live, fields: dict[str, Any], named: str
) -> None:
    assert_refused_and_nothing_changed(live, fields, named, unset="checkpoint_stall_seconds")


def test_a_stall_reaches_status_metrics_and_the_event_log(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100)
    ranks = list(node.beat().assignment.ranks)
    stalls = [0.015625, 0.046875][: len(ranks)]  # the job shows its slowest rank's
    node.beat(
        *[
            status(job_id, generation, r, last_step=20, checkpoint_stall_step=20, checkpoint_stall_seconds=s)
            for r, s in zip(ranks, stalls, strict=True)
        ]
    )
    wait_for(lambda: job_of(live, job_id).checkpoint_stall_step == 20, "the stall to reach the job")
    shown = job_dict(job_of(live, job_id))
    assert (shown["checkpoint_stall_seconds"], shown["checkpoint_stall_step"]) == (max(stalls), 20)
    samples = parse(live.scrape())
    assert samples["spotmorph_checkpoint_stall_seconds"][(("job", job_id),)] == max(stalls)
    assert samples["spotmorph_checkpoint_stall_step"][(("job", job_id),)] == 20
    logged = event_data(live, "CheckpointStallMeasured")
    assert logged[-1] == {"generation": generation, "step": 20, "stall_seconds": max(stalls)}
    untouched = job_dict(job_of(live, running_job(live, checkpoint_dir=str(live.state_dir / "c2"))[1]))
    assert (untouched["checkpoint_stall_seconds"], untouched["checkpoint_stall_step"]) == (None, None)
    # A checkpoint of the initial state (step 0) is a checkpoint too.
    node_b, other, gen_b = running_job(live, checkpoint_dir=str(live.state_dir / "c3"))
    node_b.beat(status(other, gen_b, last_step=0, checkpoint_stall_step=0, checkpoint_stall_seconds=0.25))
    wait_for(lambda: job_of(live, other).HasField("checkpoint_stall_seconds"), "the step-0 stall to reach the job")
    assert job_dict(job_of(live, other))["checkpoint_stall_step"] == 0
