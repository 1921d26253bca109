"""A heartbeat the controller may hold (``wait_seconds``): only while work may reach the node within seconds,
answered when something changed, and the field checked like any other.

Real gRPC against a live controller whose clock the test moves: a node that runs a job is answered at once; a
free node that just arrived (a growth onto it may be decided) is answered once the state changes (here: a job
submitted) or at the end of its wait, and told so (``waited``: beat again at once).
"""

from __future__ import annotations

import math
import threading
import time

import grpc
import pytest

from controller.api.reports import MAX_WAIT_SECONDS
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.test_contract import spec
from tests.controller.test_hostile_edge import Node, refusal, running_job


def test_a_node_with_work_is_answered_at_once(live_clock: Live) -> None:
    busy, job_id, _ = running_job(live_clock)
    reply = busy.beat(wait_seconds=MAX_WAIT_SECONDS)
    assert reply.assignment.job == job_id and reply.assignment.action == pb.ACTION_RUN
    assert not reply.waited


def test_a_free_node_that_may_get_work_is_answered_when_something_changes(live_clock: Live) -> None:
    running_job(live_clock)
    free = Node(live_clock)
    free.beat()  # JOINING -> READY: a growth onto it may be decided once arrivals settle
    assert free.beat(wait_seconds=0.05).waited, "nothing changed: answered at the end of the wait"
    replies: list[pb.HeartbeatResponse] = []
    held = threading.Thread(target=lambda: replies.append(free.beat(wait_seconds=MAX_WAIT_SECONDS)))
    held.start()
    for n in range(4):  # a commit the held call sees (one that came before the hold began would not wake it)
        held.join(0.3)
        if not held.is_alive():
            break
        other = spec(live_clock, name=f"another-{n}", checkpoint_dir=str(live_clock.state_dir / f"another-{n}"))
        live_clock.jobs().SubmitJob(pb.SubmitJobRequest(spec=other))
    held.join(MAX_WAIT_SECONDS - 2.0)  # well before the wait ends: a submission's commit answers it
    assert not held.is_alive() and replies[0].waited


def test_a_free_node_with_nothing_coming_is_answered_at_once(live_clock: Live) -> None:
    assert live_clock.clock is not None
    free = Node(live_clock)
    free.beat()
    live_clock.clock.at += 100.0  # long settled, no job to grow: no work within seconds
    assert not free.beat(wait_seconds=MAX_WAIT_SECONDS).waited


@pytest.mark.parametrize("wait", [-1.0, math.nan, math.inf, MAX_WAIT_SECONDS + 1])
def test_a_wait_out_of_range_is_refused_naming_the_field(live_clock: Live, wait: float) -> None:
    free = Node(live_clock)
    code, detail = refusal(lambda: free.beat(wait_seconds=wait))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "wait_seconds" in detail


def test_a_stopping_node_of_a_morphing_job_waits_until_the_next_generation_is_issued(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100)
    notice = pb.EvictionNotice(not_before=time.time() + 30, source="imds")
    stopping = node.beat(eviction=notice)
    assert stopping.assignment.action == pb.ACTION_STOP
    assert node.beat(eviction=notice, wait_seconds=0.05).waited, "its next generation comes in a reply: held"
    spare = Node(live, slots=2)
    replies: list[pb.HeartbeatResponse] = []
    held = threading.Thread(target=lambda: replies.append(spare.beat(wait_seconds=MAX_WAIT_SECONDS)))
    held.start()  # JOINING -> READY: free while a job morphs, so work may come within seconds
    ranks = list(stopping.assignment.ranks)
    stopped = [
        pb.TrainerStatus(job=job_id, generation=generation, rank=r, running=False, exit_code=0, last_step=5)
        for r in ranks
    ]
    node.beat(*stopped, eviction=notice)  # the stop is done: the next generation is issued, on the spare
    held.join(MAX_WAIT_SECONDS + 5)
    beats = [*replies, spare.beat()]
    assert any(b.assignment.generation == generation + 1 for b in beats), beats
