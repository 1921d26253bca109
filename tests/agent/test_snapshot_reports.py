"""A held rank's peer snapshots, from its progress line to the controller's rank report (hostile values dropped)."""

from __future__ import annotations

import json

from controller.api import wire
from protos.spotmorph.v1 import controller_pb2 as pb
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.agent.progress import Held, TrainerProgress, TrainerReport, absorb, snapshot_steps
from worker_agent.agent.wire import trainer_status_to_pb
from worker_agent.contract import CollectiveFailed
from worker_agent.contract.events import parse_progress_line

LINE = {"event": "collective_failed", "rank": 0, "generation": 2, "pid": 9, "time": 5.0}
FAILED = {"generation": 2, "stage": 1, "replica": 0, "step": 12, "error": "reset"}


def test_a_line_from_before_snapshots_still_parses_and_says_none() -> None:
    record = parse_progress_line(json.dumps(LINE | FAILED))
    assert record.event == CollectiveFailed(2, 1, 0, 12, "reset")
    assert absorb(TrainerProgress(), record).held == Held(1, 0, 12)


def test_the_snapshot_steps_reach_the_rank_report() -> None:
    said = FAILED | {"snapshot_own_steps": [12, 11], "snapshot_received_steps": [11]}
    progress = absorb(TrainerProgress(), parse_progress_line(json.dumps(LINE | said)))
    assert progress.held == Held(1, 0, 12, (11, 12), (11,))
    report = TrainerReport(TrainerStatus(TrainerKey("job-1", 2, 0), True), pid=9, step=12, held=progress.held)
    message = pb.TrainerStatus.FromString(trainer_status_to_pb(report).SerializeToString())
    rank = wire.rank_from_pb(message, "")
    assert (rank.held_step, rank.snapshot_own_steps, rank.snapshot_received_steps) == (12, (11, 12), (11,))


def test_hostile_snapshot_lists_are_dropped() -> None:
    assert snapshot_steps("12") == () and snapshot_steps([1, 2, 3, 4, 5]) == ()
    assert snapshot_steps([3, True, -1, "4"]) == (3,) and snapshot_steps([2.5, 2**63, 3]) == (3,)
