"""The agent's wire conversion: the spec crosses unchanged, defaults apply once, facts become requests."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from protos.jobspec import spec_from_pb, spec_to_pb
from protos.spotmorph.v1 import controller_pb2 as pb
from worker_agent.agent.converge import Assignment, TrainerKey, TrainerStatus
from worker_agent.agent.decisions import CheckpointCommitted, EvictionNotice, TrainerExited
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.wire import (
    IDLE,
    Prepare,
    Registration,
    heartbeat_reply_from_pb,
    heartbeat_to_pb,
    incoming_from_pb,
    registration_from_pb,
    report_reply_from_pb,
    report_to_pb,
)
from worker_agent.contract import CommittedCheckpoint

NODE = Registration("node-2", 3, "secret", 1.0, 10.0)


def job(**fields: Any) -> JobSpec:
    base = {"name": "j", "entrypoint": "/m/tiny_gpt.py:build", "global_batch": 8, "steps": 9, "checkpoint_dir": "/c"}
    return JobSpec.model_validate({**base, **fields})


KEY = "ab" * 32


def assignment(spec: pb.JobSpec, **fields: Any) -> pb.Assignment:
    layout = make_layout(num_layers=4, pipeline_stages=2, data_parallel=1, micro_batch_size=2, global_batch=8)
    values: dict[str, Any] = {
        "job": "job-1",
        "generation": 2,
        "ranks": [0, 1],
        "layout": pb.Layout(json=json.dumps(layout.to_dict())),
        "rendezvous_endpoint": "10.0.0.1:29501",
        "rendezvous_key": KEY,
        "checkpoint_dir": "/c",
        "action": pb.ACTION_RUN,
        "spec": spec,
    }
    return pb.Assignment(**{**values, **fields})


def test_the_spec_the_controller_sends_is_the_spec_the_agent_launches() -> None:
    for spec in (job(), job(checkpoint_interval=0, keep=1, background_checkpoint=True, timeout_seconds=5.5)):
        assert spec_from_pb(spec_to_pb(spec), "spec") == spec


def test_optional_fields_left_unset_on_the_wire_take_the_models_defaults() -> None:
    bare = pb.JobSpec(name="j", entrypoint="m.py:f", global_batch=8, steps=9, checkpoint_dir="/c")
    spec = spec_from_pb(bare, "spec")
    assert (spec.dtype, spec.schedule, spec.checkpoint_interval, spec.keep) == ("float32", "1f1b", 50, 3)


def test_an_assignment_becomes_what_to_run_and_how_to_launch_it() -> None:
    incoming = incoming_from_pb(
        assignment(spec_to_pb(job()), checkpoint_request=4, resume_step=40, resume_generation=3)
    )
    assert incoming.assignment == Assignment("job-1", 2, "run", (0, 1), checkpoint_request=4)
    placed = incoming_from_pb(assignment(spec_to_pb(job()), slots=[1, 0])).assignment
    assert placed.slots == (1, 0) and placed.slot_of(0) == 1
    assert incoming.launch is not None
    assert incoming.launch.job == job() and incoming.launch.rendezvous == "10.0.0.1:29501"
    assert incoming.launch.resume == CommittedCheckpoint(40, 3), "exactly the committed checkpoint"
    assert incoming.launch.layout["pipeline_stages"] == 2
    moved = incoming_from_pb(assignment(spec_to_pb(job()), entrypoint="/n/tiny_gpt.py:build"))
    assert moved.launch is not None and moved.launch.job.entrypoint == "/n/tiny_gpt.py:build"
    assert incoming_from_pb(assignment(spec_to_pb(job()))).launch.resume is None  # type: ignore[union-attr]
    older = incoming_from_pb(assignment(spec_to_pb(job()), resume_step=40)).launch  # a controller before v2
    assert older is not None and older.resume == CommittedCheckpoint(40, 0)


def test_no_assignment_means_idle_but_no_assignment_in_a_report_reply_means_unchanged() -> None:
    assert incoming_from_pb(None).assignment == IDLE
    assert heartbeat_reply_from_pb(pb.HeartbeatResponse()).incoming.assignment == IDLE
    assert heartbeat_reply_from_pb(pb.HeartbeatResponse()).heartbeat_interval is None
    assert report_reply_from_pb(pb.ReportEventResponse()) is None
    stop = pb.ReportEventResponse(assignment=assignment(spec_to_pb(job()), action=pb.ACTION_STOP))
    assert report_reply_from_pb(stop).assignment.action == "stop"  # type: ignore[union-attr]


def test_a_free_nodes_hint_is_the_spec_its_trainers_would_get_and_a_bad_one_is_dropped() -> None:
    assert heartbeat_reply_from_pb(pb.HeartbeatResponse()).prepare is None
    hint = pb.Prepare(job="job-1", spec=spec_to_pb(job()), entrypoint="/n/tiny_gpt.py:build")
    prepared = heartbeat_reply_from_pb(pb.HeartbeatResponse(prepare=hint)).prepare
    assert prepared == Prepare("job-1", job().model_copy(update={"entrypoint": "/n/tiny_gpt.py:build"}))
    for hostile in ("../../etc", "j" * 500, "job 1"):  # reported back in ``building``: a name, bounded
        named = pb.Prepare(job=hostile, spec=spec_to_pb(job()))
        assert heartbeat_reply_from_pb(pb.HeartbeatResponse(prepare=named)).prepare is None
    bad = pb.Prepare(job="job-1", spec=pb.JobSpec(name="j", entrypoint="m.py:f", global_batch=0, steps=9))
    reply = heartbeat_reply_from_pb(pb.HeartbeatResponse(prepare=bad, heartbeat_interval_seconds=0.5))
    assert reply.prepare is None and reply.heartbeat_interval == 0.5, "only a hint: the reply is applied"


def test_registration_defaults_when_the_controller_leaves_intervals_out() -> None:
    reply = pb.RegisterResponse(node_name="node-2", incarnation=3, node_token="t")
    assert registration_from_pb(reply) == Registration("node-2", 3, "t", 1.0, 10.0)


def test_reports_and_facts_become_requests() -> None:
    exited = TrainerReport(TrainerStatus(TrainerKey("job-1", 2, 1), False, 3), pid=7, step=12, error="x" * 2000)
    beat = heartbeat_to_pb(NODE, [exited], EvictionNotice("e", 99.0))
    assert (beat.node_name, beat.incarnation, beat.eviction.not_before) == ("node-2", 3, 99.0)
    status = beat.trainers[0]
    assert (status.exit_code, status.last_step, len(status.error), status.last_checkpoint_step) == (3, 12, 1000, 0)
    assert not heartbeat_to_pb(NODE, [], None).HasField("eviction")
    assert heartbeat_to_pb(NODE, [], None).building == ""
    assert heartbeat_to_pb(NODE, [], None, "job-1").building == "job-1"
    assert heartbeat_to_pb(NODE, [], None).wait_seconds == 0.0
    assert heartbeat_to_pb(NODE, [], None, wait_seconds=1.0).wait_seconds == 1.0
    assert heartbeat_reply_from_pb(pb.HeartbeatResponse(waited=True)).waited
    assert not heartbeat_reply_from_pb(pb.HeartbeatResponse()).waited, "an older controller never holds a reply"
    assert report_to_pb(NODE, TrainerExited(exited)).WhichOneof("event") == "trainer_exited"
    committed = report_to_pb(NODE, CheckpointCommitted("job-1", 2, 40))
    assert committed.checkpoint_committed.step == 40 and committed.node_name == "node-2"
    notice = report_to_pb(NODE, EvictionNotice("e", 99.0))
    assert notice.eviction.source == "azure-scheduled-events"


@pytest.mark.parametrize("deadline", [math.nan, math.inf, -1.0, 1e300])
def test_a_salvage_order_whose_deadline_is_no_time_is_unusable(deadline: float) -> None:
    """Before: a NaN deadline reached the trainers, whose ``now > deadline`` never holds: no deadline at all."""
    order = pb.Salvage(step=7, writers=[0, 1], deadline=deadline)
    held = assignment(spec_to_pb(job()), action=pb.ACTION_HOLD, world_size=2, salvage=order)
    with pytest.raises(UserInputError, match="salvage deadline"):
        incoming_from_pb(held)
    order = pb.Salvage(step=7, writers=[0, 1], deadline=5.0)
    good = assignment(spec_to_pb(job()), action=pb.ACTION_HOLD, world_size=2, salvage=order)
    assert incoming_from_pb(good).assignment.salvage is not None


@pytest.mark.parametrize("key", ["", "AB" * 32, "ab" * 31, "ab" * 32 + "\n", "zz" * 32])
def test_an_assignment_without_a_proper_rendezvous_key_is_refused(key: str) -> None:
    """Its trainers could not prove their generation's key to its store (issue 44): refused as a whole."""
    with pytest.raises(UserInputError, match="rendezvous_key is not 64 hex digits"):
        incoming_from_pb(assignment(spec_to_pb(job()), rendezvous_key=key))
    launch = incoming_from_pb(assignment(spec_to_pb(job()))).launch
    assert launch is not None and launch.rendezvous_key == KEY


def test_leaving_is_read_with_a_stop_only() -> None:
    """The controller takes the node off the job at this stop (a shrink): its trainers hand their layers over."""
    stop = incoming_from_pb(assignment(spec_to_pb(job()), action=pb.ACTION_STOP, leaving=True)).assignment
    assert stop.action == "stop" and stop.leaving
    run = incoming_from_pb(assignment(spec_to_pb(job()), leaving=True, await_leavers=True)).assignment
    assert run.action == "run" and not run.leaving and not run.await_leavers, "a run has nothing to leave"
    kept = incoming_from_pb(assignment(spec_to_pb(job()), action=pb.ACTION_STOP, await_leavers=True)).assignment
    assert kept.await_leavers and not kept.leaving
