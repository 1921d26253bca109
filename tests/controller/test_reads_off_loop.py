"""Serving reads never blocks the event loop on SQLite: every store read that ListJobs, GetJob,
CancelJob, WatchEvents (also following), the cluster calls, a metrics scrape and the dashboard's data
cause runs on another thread than the controller's loop."""

from __future__ import annotations

import json
import threading
import urllib.request

from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.conftest import Live
from tests.controller.helpers import recording_reads
from tests.controller.test_contract import spec


def test_serving_reads_the_store_off_the_event_loop(live: Live) -> None:
    async def loop_thread() -> threading.Thread:
        return threading.current_thread()

    on_loop = live.run(loop_thread())
    reads = recording_reads(live.controller.store)
    jobs, cluster = live.jobs(), live.cluster()
    reg = live.agent(live.agent_token()).Register(pb.RegisterRequest(slots=2, address="127.0.0.1"))
    live.agent(reg.node_token).Heartbeat(pb.HeartbeatRequest(node_name=reg.node_name, incarnation=reg.incarnation))
    job_id = jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id
    assert jobs.GetJob(pb.GetJobRequest(id=job_id)).generation == 1
    assert [j.id for j in jobs.ListJobs(pb.ListJobsRequest()).jobs] == [job_id]
    history = list(jobs.WatchEvents(pb.WatchEventsRequest(job=job_id)))
    with live.channel(live.token("reader")) as channel:  # closing it ends the follower
        follow = pb.WatchEventsRequest(after_seq=history[-1].seq, follow=True)
        following = iter(rpc.JobsStub(channel).WatchEvents(follow, timeout=30))
        assert jobs.CancelJob(pb.CancelJobRequest(id=job_id)).state == pb.JOB_STATE_CANCELLED
        assert next(following).seq > history[-1].seq  # woken by the cancel's commit
    assert [n.name for n in cluster.ListNodes(pb.ListNodesRequest()).nodes] == [reg.node_name]
    assert dict(cluster.GetClusterState(pb.GetClusterStateRequest()).job_states) == {"CANCELLED": 1}
    assert "spotmorph_morphs" in live.scrape()
    request = urllib.request.Request(f"http://127.0.0.1:{live.controller.metrics_port}/api/v1/dashboard")
    request.add_header("Authorization", f"Bearer {live.token('reader')}")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert json.loads(reply.read())["jobs"][0]["id"] == job_id
    assert {"generations", "events", "event_counts", "recent_events"} <= {method for method, _ in reads}
    blocking = sorted({method for method, thread in reads if thread is on_loop})
    assert blocking == [], f"store reads on the event loop: {blocking}"
