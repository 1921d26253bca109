"""Two controllers on one PostgreSQL database, in this process: one leads, the other refuses writes naming it and
answers reads from the database; tokens of either work at both; a leader's clean stop hands over at once, and
the new leader's replies carry the next epoch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.persistence import leases
from controller.persistence.store import Store
from protos.reasons import leader_of, reason_of
from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.local.processes import free_port
from tests.controller.conftest import Live, running
from tests.controller.test_contract import spec

# The lease is long enough for a starved test thread (make test: two workers on two cores); handovers here are
# releases, taken at the next 0.1 s poll, not waits for expiry.
FAST: dict[str, Any] = {"lease_seconds": 3.0, "standby_poll_seconds": 0.1}


@pytest.fixture
def pair(tmp_path: Path, postgres_url: str) -> Iterator[tuple[Live, Live]]:
    with ExitStack() as stack:
        first = stack.enter_context(running(tmp_path / "a", None, database=postgres_url, **FAST))
        second = stack.enter_context(running(tmp_path / "b", None, database=postgres_url, **FAST))
        yield first, second


def refusal(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def eventually(check: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.05)


def test_the_standby_refuses_writes_naming_the_leader_and_answers_reads(pair: tuple[Live, Live]) -> None:
    leader, standby = pair
    assert leader.controller.leadership.leading and not standby.controller.leadership.leading
    refused = refusal(lambda: standby.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(standby))))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason_of(refused.trailing_metadata()) == "not-leader"
    assert leader_of(refused.trailing_metadata()) == leader.address
    assert leader.address in str(refused.details())
    job_id = leader.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(leader))).id
    eventually(lambda: [j.id for j in standby.jobs().ListJobs(pb.ListJobsRequest()).jobs] == [job_id], "a read")
    assert standby.jobs().GetJob(pb.GetJobRequest(id=job_id)).state == pb.JOB_STATE_QUEUED
    # Agents are refused the same way: their heartbeats are the leader's to decide on.
    agent = standby.agent(standby.agent_token())
    beat = refusal(lambda: agent.Register(pb.RegisterRequest(slots=1, address="127.0.0.1")))
    assert reason_of(beat.trailing_metadata()) == "not-leader"


def test_either_controllers_tokens_work_at_both(pair: tuple[Live, Live]) -> None:
    leader, standby = pair
    assert leader.token("operator") == standby.token("operator")
    assert leader.token("reader") == standby.token("reader")
    assert standby.agent_token("vm-7") == leader.agent_token("vm-7")
    standby.jobs("reader").ListJobs(pb.ListJobsRequest())  # answered: a reader token of the leader's


def test_a_clean_stop_hands_over_at_once_and_the_new_epoch_fences_the_agents(tmp_path: Path, postgres_url: str) -> None:
    with running(tmp_path / "a", None, database=postgres_url, **FAST) as first:
        agent = first.agent(first.agent_token("vm-1"))
        registered = agent.Register(pb.RegisterRequest(slots=1, address="127.0.0.1"))
        assert registered.epoch == 1
        job_id = first.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(first))).id
        with running(tmp_path / "b", database=postgres_url, lease_seconds=30.0, standby_poll_seconds=0.1) as second:
            assert not second.controller.leadership.leading
            node = second.agent(registered.node_token)
            request = pb.HeartbeatRequest(node_name=registered.node_name, incarnation=registered.incarnation)
            assert reason_of(refusal(lambda: node.Heartbeat(request)).trailing_metadata()) == "not-leader"
            stopped = time.monotonic()
            first.run(first.controller.stop(grace=0.1))
            eventually(lambda: second.controller.leadership.leading, "the standby leads after a clean stop", 5.0)
            assert time.monotonic() - stopped < 5.0, "a released lease is taken at the next poll, not at expiry"
            beat = node.Heartbeat(request)  # the node token from the old leader is valid at the new one
            assert beat.epoch == 2 and beat.assignment.job == job_id
            store = Store(postgres_url)
            lease = leases.current(store.engine)
            assert lease is not None and lease.epoch == 2 and lease.address == second.address
            store.close()


def test_spotmorph_controllers_names_the_leader_the_standby_and_one_down(pair: tuple[Live, Live]) -> None:
    leader, standby = pair
    dead = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "spotmorph.cli", "controllers", "--json", "--token", leader.token("reader")]
    done = subprocess.run(
        [*command, "--controller", f"{leader.address},{standby.address},{dead}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["address"]: row for row in json.loads(done.stdout)}
    assert (rows[leader.address]["role"], rows[leader.address]["epoch"]) == ("LEADING", 1)
    assert (rows[standby.address]["role"], rows[standby.address]["leader"]) == ("STANDBY", leader.address)
    assert rows[dead]["role"] == "NO ANSWER" and "UNAVAILABLE" in rows[dead]["error"]
    state = standby.cluster().GetClusterState(pb.GetClusterStateRequest())
    assert (state.role, state.epoch, state.leader) == ("STANDBY", 0, leader.address)
    assert "spotmorph_controller_leading 1.0" in leader.scrape() and "spotmorph_controller_epoch 1.0" in leader.scrape()
    assert "spotmorph_controller_leading 0.0" in standby.scrape()
