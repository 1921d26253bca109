"""Serving reads never blocks the event loop on SQLite: every store read that ListJobs, GetJob,
CancelJob, WatchEvents (also following), the cluster calls and a metrics scrape cause runs on another
thread than the controller's loop."""

from __future__ import annotations

import threading

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
    assert {"generations", "events", "event_counts"} <= {method for method, _ in reads}
    blocking = sorted({method for method, thread in reads if thread is on_loop})
    assert blocking == [], f"store reads on the event loop: {blocking}"
