"""The Cluster service: nodes, jobs, the queue and heartbeat latency, all from the view's memory."""

from __future__ import annotations

from collections import Counter

from controller.api import paging, wire
from controller.api.leader_gate import Leading
from controller.api.status import Context, answered
from controller.core.lifecycle import JOB_TERMINAL, NodeState
from controller.shell.latency import BOUNDS
from controller.shell.views import StateView, join_order
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc

SUMMARY_LIMIT = paging.MAX_PAGE_SIZE  # nodes and queued ids in one GetClusterState at most
JOB_LIMIT = 200  # jobs: a spec may hold 4 KiB paths, so 200 stay under 2 MiB, below a client's 4 MiB default


class ClusterService(rpc.ClusterServicer):
    def __init__(self, view: StateView, schema_version: int, leadership: Leading | None = None) -> None:
        self.view = view
        self.schema_version = schema_version
        self.leadership = leadership  # None: the only controller (tests)

    async def ListNodes(self, request: pb.ListNodesRequest, context: Context) -> pb.ListNodesResponse:
        async with answered(context):
            size = paging.page_size(request.page_size)
            nodes, token = paging.page_of_nodes(self.view.nodes(), join_order, size, request.page_token)
        return pb.ListNodesResponse(nodes=[wire.node_to_pb(n) for n in nodes], next_page_token=token)

    def _role(self) -> tuple[str, int, str]:
        """Who answers: this controller's role, epoch and the leader it knows of."""
        lead = self.leadership
        if lead is None:
            return "LEADING", 0, ""
        return ("LEADING" if lead.leading else "STANDBY"), lead.epoch, lead.leader_address()

    async def GetClusterState(self, request: pb.GetClusterStateRequest, context: Context) -> pb.ClusterState:
        """A summary bounded whatever the history (70,000 jobs overran the message cap): see the proto."""
        cluster = self.view.cluster()
        role, epoch, leader = self._role()
        latency = cluster.heartbeat_latency
        nodes = [n for n in cluster.nodes if n.state is not NodeState.GONE]
        jobs = [j for j in cluster.jobs if j.state not in JOB_TERMINAL]
        return pb.ClusterState(
            nodes=[wire.node_to_pb(n) for n in nodes[:SUMMARY_LIMIT]],
            jobs=[wire.job_to_pb(j, on_demand=self.view.on_demand(j)) for j in jobs[:JOB_LIMIT]],
            queue=cluster.queue[:SUMMARY_LIMIT],
            node_states=Counter(n.state.value for n in cluster.nodes),
            job_states=Counter(j.state.value for j in cluster.jobs),
            nodes_left_off=max(0, len(nodes) - SUMMARY_LIMIT),
            jobs_left_off=max(0, len(jobs) - JOB_LIMIT),
            queue_left_off=max(0, len(cluster.queue) - SUMMARY_LIMIT),
            started_at=cluster.started_at,
            schema_version=self.schema_version,
            role=role,
            epoch=epoch,
            leader=leader,
            heartbeat_latency=pb.LatencyHistogram(
                count=latency.count,
                sum_seconds=latency.sum_seconds,
                bucket_upper_seconds=BOUNDS,
                bucket_counts=latency.counts,
            ),
        )
