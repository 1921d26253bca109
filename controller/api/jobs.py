"""The Jobs service: submit and cancel through the runner; list, get and watch through the view.

A submission is checked at the edge (:mod:`controller.api.submission`) and decided on atomically: a
SubmitJob that fails leaves no job behind, and a retry carrying the same idempotency key gets the job
the first one made. WatchLogs reads the trainers' logs through the log book; a follower's stream ends
once the job ended and no line came for a heartbeat expiry (the agents ship every heartbeat interval). Follow
streams are bounded per caller and in all (:mod:`controller.api.followers`), and each wakes only on its own
job's lines (the job's end is seen at the next poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import grpc

from controller.api import logs, paging, submission, wire
from controller.api.auth import bearer
from controller.api.followers import Followers
from controller.api.status import Context, abort, answered
from controller.api.writes import Writes
from controller.core.lifecycle import JOB_TERMINAL
from controller.shell.logbook import LogBook
from controller.shell.views import StateView
from morphing.validation import MAX_NAME_LENGTH, check_count, check_name, shown
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc

EVENTS_PER_READ = 500
LINES_PER_READ = 1000
FOLLOW_POLL_SECONDS = 1.0  # a follower re-reads at least this often, even with no commit to wake it


class JobsService(rpc.JobsServicer):
    def __init__(
        self,
        view: StateView,
        writes: Writes,
        stopping: asyncio.Event,
        *,
        logbook: LogBook,
        followers: Followers | None = None,
    ) -> None:
        self.view = view
        self.writes = writes
        self.stopping = stopping
        self.logbook = logbook
        self.followers = followers or Followers()

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Context) -> pb.SubmitJobResponse:
        async with answered(context):
            asked = submission.checked(request)
            if submission.retried(self.view.jobs(), asked) is None:  # a retry's files are its own job's by now
                await asyncio.to_thread(submission.check_files, asked.spec, asked.model_layers)
            job = await self.writes.submit(asked.spec, asked.idempotency_key)
        return pb.SubmitJobResponse(id=job.id)

    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.Job:
        detail = await self.view.job_detail(request.id)
        if detail is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"job {shown(request.id)} not found")
        return wire.job_to_pb(detail.job, detail.generations, detail.on_demand)

    async def ListJobs(self, request: pb.ListJobsRequest, context: Context) -> pb.ListJobsResponse:
        async with answered(context):
            jobs, token = paging.page_of_jobs(self.view.jobs(), paging.page_size(request.page_size), request.page_token)
        details = await self.view.job_details(tuple(jobs))
        return pb.ListJobsResponse(
            jobs=[wire.job_to_pb(d.job, d.generations, d.on_demand) for d in details], next_page_token=token
        )

    async def CancelJob(self, request: pb.CancelJobRequest, context: Context) -> pb.Job:
        job = self.view.job(request.id)
        if job is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"job {shown(request.id)} not found")
        async with answered(context):  # it may end meanwhile (Stale), or decisions may be down
            await self.writes.cancel(job.id, "an operator")
        detail = await self.view.job_detail(job.id)
        assert detail is not None  # jobs are never deleted
        return wire.job_to_pb(detail.job, detail.generations, detail.on_demand)

    async def WatchEvents(self, request: pb.WatchEventsRequest, context: Context) -> AsyncIterator[pb.Event]:
        async with answered(context):
            after = check_count("after_seq", request.after_seq)
            decision = check_count("decision", request.decision) or None
            if request.job:
                check_name("job", request.job, 2 * MAX_NAME_LENGTH)
        while True:
            changed = self.view.next_change()
            rows = await self.view.events(after, request.job or None, EVENTS_PER_READ, decision)
            for row in rows:
                after = row.seq
                yield pb.Event(
                    seq=row.seq,
                    at=row.at,
                    kind=row.kind,
                    job=row.job or "",
                    node=row.node or "",
                    data_json=json.dumps(row.data, sort_keys=True),
                    decision=row.decision or 0,
                    stimulus=wire.stimulus_to_pb(row.stimulus),
                )
            if rows:
                continue
            if not request.follow or self.stopping.is_set():
                return
            await self._until_change_or_stop(changed)

    async def WatchLogs(self, request: pb.WatchLogsRequest, context: Context) -> AsyncIterator[pb.LogLine]:
        with contextlib.ExitStack() as held:
            async with answered(context):
                query = logs.query(self.view, request)
                if request.follow:  # RESOURCE_EXHAUSTED past the bounds (followers.py); released when it ends
                    held.enter_context(self.followers.admitted(bearer(context.invocation_metadata())))
            async for line in self._lines(query, request.follow):
                yield line

    async def _lines(self, query: logs.LogQuery, follow: bool) -> AsyncIterator[pb.LogLine]:
        after, heard = query.after, 0.0  # heard: when the newest line seen was received
        while True:
            change = self.logbook.next_change(query.job)  # a new line of this job (its end: seen at the poll)
            rows = await self.logbook.lines(query.job, after, query.rank, query.generation, LINES_PER_READ)
            for row in rows:
                after, heard = row.id, max(heard, row.at)
                yield logs.line_to_pb(row)
            if rows:
                continue
            if not follow or self.stopping.is_set() or self._ended_and_quiet(query.job, heard):
                return
            await self._until_change_or_stop(change)

    def _ended_and_quiet(self, job_id: str, heard: float) -> bool:
        """The job ended, and neither its end nor a line of it is as recent as a heartbeat expiry."""
        job = self.view.job(job_id)
        if job is None or job.state not in JOB_TERMINAL:
            return False
        return self.view.now() - max(job.state_since, heard) >= self.view.heartbeat_expiry_seconds

    async def _until_change_or_stop(self, *changed: asyncio.Event) -> None:
        waiters = {asyncio.ensure_future(event.wait()) for event in (*changed, self.stopping)}
        await asyncio.wait(waiters, timeout=FOLLOW_POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
