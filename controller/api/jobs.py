"""The Jobs service: submit and cancel through the runner; list, get and watch through the view.

A submission is checked at the edge (:mod:`controller.api.submission`) and decided on atomically: a
SubmitJob that fails leaves no job behind, and a retry carrying the same idempotency key gets the job
the first one made.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc

from controller.api import paging, submission, wire
from controller.api.status import Context, abort, answered
from controller.api.writes import Writes
from controller.shell.views import StateView
from morphing.validation import MAX_NAME_LENGTH, check_count, check_name, shown
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc

EVENTS_PER_READ = 500
FOLLOW_POLL_SECONDS = 1.0  # a follower re-reads at least this often, even with no commit to wake it


class JobsService(rpc.JobsServicer):
    def __init__(self, view: StateView, writes: Writes, stopping: asyncio.Event) -> None:
        self.view = view
        self.writes = writes
        self.stopping = stopping

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Context) -> pb.SubmitJobResponse:
        async with answered(context):
            spec, key = submission.checked(request)
            await asyncio.to_thread(submission.check_files, spec)
            job = await self.writes.submit(spec, key)
        return pb.SubmitJobResponse(id=job.id)

    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.Job:
        detail = await self.view.job_detail(request.id)
        if detail is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"job {shown(request.id)} not found")
        return wire.job_to_pb(detail.job, detail.generations)

    async def ListJobs(self, request: pb.ListJobsRequest, context: Context) -> pb.ListJobsResponse:
        async with answered(context):
            jobs, token = paging.page_of_jobs(self.view.jobs(), paging.page_size(request.page_size), request.page_token)
        details = await self.view.job_details(tuple(jobs))
        return pb.ListJobsResponse(jobs=[wire.job_to_pb(d.job, d.generations) for d in details], next_page_token=token)

    async def CancelJob(self, request: pb.CancelJobRequest, context: Context) -> pb.Job:
        job = self.view.job(request.id)
        if job is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"job {shown(request.id)} not found")
        async with answered(context):  # it may end meanwhile (Stale), or decisions may be down
            await self.writes.cancel(job.id, "an operator")
        detail = await self.view.job_detail(job.id)
        assert detail is not None  # jobs are never deleted
        return wire.job_to_pb(detail.job, detail.generations)

    async def WatchEvents(self, request: pb.WatchEventsRequest, context: Context) -> AsyncIterator[pb.Event]:
        async with answered(context):
            after = check_count("after_seq", request.after_seq)
            if request.job:
                check_name("job", request.job, 2 * MAX_NAME_LENGTH)
        while True:
            changed = self.view.next_change()
            rows = await self.view.events(after, request.job or None, EVENTS_PER_READ)
            for row in rows:
                after = row.seq
                yield pb.Event(
                    seq=row.seq,
                    at=row.at,
                    kind=row.kind,
                    job=row.job or "",
                    node=row.node or "",
                    data_json=json.dumps(row.data, sort_keys=True),
                )
            if rows:
                continue
            if not request.follow or self.stopping.is_set():
                return
            await self._until_change_or_stop(changed)

    async def _until_change_or_stop(self, changed: asyncio.Event) -> None:
        waiter = asyncio.ensure_future(changed.wait())
        stopper = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({waiter, stopper}, timeout=FOLLOW_POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()
