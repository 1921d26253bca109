"""The Cluster service: nodes, jobs, the queue and heartbeat latency, all from the view's memory."""

from __future__ import annotations

from controller.api import paging, wire
from controller.api.status import Context, answered
from controller.shell.latency import BOUNDS
from controller.shell.views import StateView, join_order
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc


class ClusterService(rpc.ClusterServicer):
    def __init__(self, view: StateView, schema_version: int) -> None:
        self.view = view
        self.schema_version = schema_version

    async def ListNodes(self, request: pb.ListNodesRequest, context: Context) -> pb.ListNodesResponse:
        async with answered(context):
            size = paging.page_size(request.page_size)
            nodes, token = paging.page_of_nodes(self.view.nodes(), join_order, size, request.page_token)
        return pb.ListNodesResponse(nodes=[wire.node_to_pb(n) for n in nodes], next_page_token=token)

    async def GetClusterState(self, request: pb.GetClusterStateRequest, context: Context) -> pb.ClusterState:
        cluster = self.view.cluster()
        latency = cluster.heartbeat_latency
        return pb.ClusterState(
            nodes=[wire.node_to_pb(n) for n in cluster.nodes],
            jobs=[wire.job_to_pb(j) for j in cluster.jobs],
            queue=cluster.queue,
            started_at=cluster.started_at,
            schema_version=self.schema_version,
            heartbeat_latency=pb.LatencyHistogram(
                count=latency.count,
                sum_seconds=latency.sum_seconds,
                bucket_upper_seconds=BOUNDS,
                bucket_counts=latency.counts,
            ),
        )
