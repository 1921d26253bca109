"""ListJobs and ListNodes come in pages, and the CLI follows them: a list never outgrows a gRPC message.

Before, one reply carried every job (the 16 MiB cap was hit near 70,000 jobs). A garbage token or a
page larger than the maximum is INVALID_ARGUMENT; the pages together are exactly the whole list.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import grpc
import pytest

from controller.api import cluster as cluster_api
from controller.api.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, encode
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.test_contract import code_of, spec
from tests.runtime.helpers import run


def register(live: Live, count: int) -> None:
    for vm in range(count):  # a VM each: a per-VM token is one live node
        live.agent(live.agent_token(f"vm-{vm}")).Register(pb.RegisterRequest(slots=1, address="127.0.0.1"))


def test_the_cluster_state_is_a_bounded_summary(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """GetClusterState carried every job and node ever kept: it outgrew the message cap as ListJobs did."""
    monkeypatch.setattr(cluster_api, "SUMMARY_LIMIT", 2)
    monkeypatch.setattr(cluster_api, "JOB_LIMIT", 2)
    jobs = live.jobs()
    ids = [
        jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live, checkpoint_dir=str(live.state_dir / f"ckpt-{i}")))).id
        for i in range(4)
    ]
    jobs.CancelJob(pb.CancelJobRequest(id=ids[0]))
    register(live, 3)
    state = live.cluster().GetClusterState(pb.GetClusterStateRequest())
    assert [j.id for j in state.jobs] == ids[1:3] and state.jobs_left_off == 1  # the cancelled job is not listed
    assert list(state.queue) == ids[1:3] and state.queue_left_off == 1  # no node has beaten yet: all queued
    assert dict(state.job_states)["CANCELLED"] == 1 and sum(state.job_states.values()) == 4
    assert len(state.nodes) == 2 and state.nodes_left_off == 1 and sum(state.node_states.values()) == 3


def test_jobs_come_in_pages_that_add_up_to_the_whole_list(live: Live) -> None:
    jobs = live.jobs()
    submitted = [
        jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live, checkpoint_dir=str(live.state_dir / f"ckpt-{i}")))).id
        for i in range(7)
    ]
    seen, token, sizes = [], "", []
    while True:
        reply = jobs.ListJobs(pb.ListJobsRequest(page_size=3, page_token=token))
        seen += [j.id for j in reply.jobs]
        sizes.append(len(reply.jobs))
        token = reply.next_page_token
        if not token:
            break
    assert seen == submitted and sizes == [3, 3, 1]
    assert [j.id for j in jobs.ListJobs(pb.ListJobsRequest()).jobs] == submitted, "the default page holds them all"


def test_nodes_come_in_pages_in_join_order(live: Live) -> None:
    register(live, 7)
    cluster = live.cluster()
    whole = [n.name for n in cluster.ListNodes(pb.ListNodesRequest()).nodes]
    first = cluster.ListNodes(pb.ListNodesRequest(page_size=4))
    rest = cluster.ListNodes(pb.ListNodesRequest(page_size=4, page_token=first.next_page_token))
    assert [n.name for n in [*first.nodes, *rest.nodes]] == whole and len(whole) == 7
    assert first.next_page_token and not rest.next_page_token


BAD_TOKENS = {
    "garbage": "not a token at all!",
    "base64 of garbage": "Z2FyYmFnZQ==",
    "a token of the other list": encode("nodes", [0.0, "node-1"]),
    "a negative position": encode("jobs", [-5]),
    "a position of the wrong type": encode("jobs", ["3"]),
    "too long": "A" * 10_000,
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENS))
def test_a_token_that_is_not_one_is_invalid_argument(case: str, live: Live) -> None:
    request = pb.ListJobsRequest(page_token=BAD_TOKENS[case])
    assert code_of(lambda: live.jobs().ListJobs(request)) == grpc.StatusCode.INVALID_ARGUMENT


def test_a_bad_node_token_or_a_page_beyond_the_maximum_is_invalid_argument(live: Live) -> None:
    cluster, jobs = live.cluster(), live.jobs()
    for token in ("%%%", encode("jobs", [1]), encode("nodes", [float("nan"), "x"]), encode("nodes", [1.0])):
        request = pb.ListNodesRequest(page_token=token)
        assert code_of(functools.partial(cluster.ListNodes, request)) == grpc.StatusCode.INVALID_ARGUMENT, token
    too_big = MAX_PAGE_SIZE + 1
    assert code_of(lambda: jobs.ListJobs(pb.ListJobsRequest(page_size=too_big))) == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        code_of(lambda: cluster.ListNodes(pb.ListNodesRequest(page_size=too_big))) == grpc.StatusCode.INVALID_ARGUMENT
    )


@pytest.mark.slow
def test_spotmorph_nodes_follows_the_pages_and_shows_every_node(live: Live) -> None:
    register(live, DEFAULT_PAGE_SIZE + 3)
    assert len(live.cluster().ListNodes(pb.ListNodesRequest()).nodes) == DEFAULT_PAGE_SIZE, "one page is not all"
    command = [sys.executable, "-m", "spotmorph.cli", "nodes", "--json", "--controller", live.address]
    env = {**os.environ, "SPOTMORPH_TOKEN": live.token("operator")}
    done = run(command, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    names = [n["name"] for n in json.loads(done.stdout)]
    assert len(names) == DEFAULT_PAGE_SIZE + 3 and len(set(names)) == len(names)
