"""The gRPC servicers: validate, fence, hand decisions to the runner, reply from persisted state.

Every reply is computed after the runner committed (persist-before-reply). Bad input gets a status
naming the field (INVALID_ARGUMENT), unknown ids NOT_FOUND, stale incarnations or generations
FAILED_PRECONDITION; anything unexpected is INTERNAL for that call only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, NoReturn, TypeAlias

import grpc

from controller import agents, convert
from controller.auth import Principal, Role, Tokens, principal_of
from controller.latency import BOUNDS, Histogram
from controller.lifecycle import JOB_TERMINAL
from controller.model import JobRecord, NodeObservation, NodeRecord, ranks_by_node
from controller.reconcile import assignment_for
from controller.runner import Runner
from controller.spec import JobSpec, entrypoint_problem, profile_problem
from morphing.errors import UserInputError
from morphing.jobspec import parse_job_spec
from morphing.layout import Layout
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from scheduler.queue import QueueEntry, admission_order

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
MAX_TRAINERS = 4096


async def _abort(context: Context, code: grpc.StatusCode, detail: str) -> NoReturn:
    await context.abort(code, detail)
    raise AssertionError("unreachable")  # abort raises


class JobsService(rpc.JobsServicer):
    def __init__(self, runner: Runner, tokens: Tokens, stopping: asyncio.Event) -> None:
        self.runner = runner
        self.tokens = tokens
        self.stopping = stopping

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Context) -> pb.SubmitJobResponse:
        try:
            spec = parse_job_spec(convert.spec_to_dict(request.spec))
        except UserInputError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        problem = entrypoint_problem(spec) or profile_problem(spec)
        if problem:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
        job = await self.runner.submit(spec)
        return pb.SubmitJobResponse(id=job.id)

    def _job(self, job_id: str) -> pb.Job | None:
        job = self.runner.jobs.get(job_id)
        if job is None:
            return None
        return convert.job_to_pb(job, self.runner.store.generations(job_id))

    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.Job:
        found = self._job(request.id)
        if found is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"job {request.id!r} not found")
        return found

    async def ListJobs(self, request: pb.ListJobsRequest, context: Context) -> pb.ListJobsResponse:
        return pb.ListJobsResponse(jobs=[j for j in map(self._job, self.runner.jobs) if j is not None])

    async def CancelJob(self, request: pb.CancelJobRequest, context: Context) -> pb.Job:
        job = self.runner.jobs.get(request.id)
        if job is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"job {request.id!r} not found")
        if job.state in JOB_TERMINAL:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"job {job.id} already {job.state}")
        await self.runner.cancel(job.id, "an operator")
        found = self._job(job.id)
        assert found is not None
        return found

    async def WatchEvents(self, request: pb.WatchEventsRequest, context: Context) -> AsyncIterator[pb.Event]:
        after = request.after_seq
        while True:
            changed = self.runner.changed
            rows = await asyncio.to_thread(self.runner.store.events, after, request.job or None, 500)
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
            waiter = asyncio.ensure_future(changed.wait())
            stopper = asyncio.ensure_future(self.stopping.wait())
            await asyncio.wait({waiter, stopper}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()


class ClusterService(rpc.ClusterServicer):
    def __init__(self, runner: Runner, schema_version: int, heartbeat_latency: Histogram | None = None) -> None:
        self.runner = runner
        self.schema_version = schema_version
        self.heartbeat_latency = heartbeat_latency or Histogram()

    async def ListNodes(self, request: pb.ListNodesRequest, context: Context) -> pb.ListNodesResponse:
        nodes = sorted(self.runner.nodes.values(), key=lambda n: (n.joined_at, n.name))
        return pb.ListNodesResponse(nodes=[convert.node_to_pb(n) for n in nodes])

    async def GetClusterState(self, request: pb.GetClusterStateRequest, context: Context) -> pb.ClusterState:
        runner = self.runner
        queued = [
            QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in runner.jobs.values() if j.state == "QUEUED"
        ]
        return pb.ClusterState(
            nodes=[convert.node_to_pb(n) for n in runner.nodes.values()],
            jobs=[convert.job_to_pb(j, []) for j in runner.jobs.values()],
            queue=[e.job_id for e in admission_order(queued)],
            started_at=runner.started_at,
            schema_version=self.schema_version,
            heartbeat_latency=pb.LatencyHistogram(
                count=self.heartbeat_latency.count,
                sum_seconds=self.heartbeat_latency.sum,
                bucket_upper_seconds=BOUNDS,
                bucket_counts=self.heartbeat_latency.counts,
            ),
        )


class AgentService(rpc.AgentServicer):
    def __init__(self, runner: Runner, tokens: Tokens, interval: float, latency: Histogram | None = None) -> None:
        self.runner = runner
        self.tokens = tokens
        self.interval = interval
        self.latency = latency or Histogram()  # time inside Heartbeat, shown in GetClusterState
        self._replies: dict[str, tuple[NodeRecord | None, JobRecord | None, pb.Assignment | None]] = {}
        self._layouts: dict[str, tuple[Layout, JobSpec, pb.Layout | None, pb.JobSpec, dict[str, tuple[int, ...]]]] = {}

    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.RegisterResponse:
        if not 1 <= request.slots <= 1024:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"slots={request.slots}: use 1..1024")
        if not request.address or len(request.address) > 255:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "address: the host other nodes reach this one at")
        registered: list[Any] = []

        def decide(world: Any, now: float) -> list[Any]:
            node, commands = agents.register(world, request.node_name, request.slots, request.address, now)
            registered.append(node)
            return commands

        try:
            await self.runner.decide(decide)
        except ValueError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        node = registered[0]
        return pb.RegisterResponse(
            node_name=node.name,
            incarnation=node.incarnation,
            node_token=self.tokens.node_token(node.name, node.incarnation),
            heartbeat_interval_seconds=self.interval,
            heartbeat_expiry_seconds=self.runner.config.heartbeat_expiry_seconds,
        )

    async def _fence(self, name: str, incarnation: int, context: Context) -> None:
        principal: Principal | None = principal_of(context, self.tokens)
        if principal is None or principal.role is not Role.NODE or principal.node != name:
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED, f"this token may not act as node {name!r}")
        if principal.incarnation != incarnation:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "token and incarnation differ; register again")
        try:
            agents.check_incarnation(self.runner.world, name, incarnation)
        except LookupError as exc:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
        except agents.Stale as exc:
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def _check_generations(self, trainers: Any, context: Context) -> None:
        if len(trainers) > MAX_TRAINERS:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"trainers: at most {MAX_TRAINERS}")
        for t in trainers:
            job = self.runner.jobs.get(t.job)
            if job is not None and t.generation > job.generation:
                await _abort(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"trainers: job {t.job} generation {t.generation} was never issued (newest {job.generation})",
                )

    def _reply_assignment(self, name: str) -> pb.Assignment | None:
        """The node's assignment on the wire, rebuilt only when its node or job record changed.

        Records are immutable and replaced on every change, so identity says "unchanged". The parts that
        are the same for every node of a generation (layout JSON, spec, who runs which rank) are built
        once per layout, not once per heartbeat: for a job on 1,000 nodes they are O(nodes) each.
        """
        runner = self.runner
        node = runner.nodes.get(name)
        job = runner.jobs.get(node.job) if node is not None and node.job is not None else None
        hit = self._replies.get(name)
        if hit is not None and hit[0] is node and hit[1] is job:
            return hit[2]
        layout_pb: pb.Layout | None = None
        spec_pb: pb.JobSpec | None = None
        ranks_of: dict[str, tuple[int, ...]] | None = None
        if job is not None and job.layout is not None:
            found = self._layouts.get(job.id)
            if found is None or found[0] is not job.layout or found[1] is not job.spec:
                layout_pb, spec_pb = convert.layout_to_pb(job.layout), convert.spec_to_pb(job.spec)
                found = (job.layout, job.spec, layout_pb, spec_pb, ranks_by_node(job.layout))
                self._layouts[job.id] = found
            _, _, layout_pb, spec_pb, ranks_of = found
        reply = convert.assignment_to_pb(assignment_for(runner.world, name, ranks_of), layout_pb, spec_pb)
        self._replies[name] = (node, job, reply)
        return reply

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context) -> pb.HeartbeatResponse:
        started = time.perf_counter()
        try:
            await self._fence(request.node_name, request.incarnation, context)
            await self._check_generations(request.trainers, context)
            seen = convert.observation_from_pb(request, self.runner.clock.now())
            await self.runner.observe(request.node_name, seen)
            return pb.HeartbeatResponse(
                assignment=self._reply_assignment(request.node_name), heartbeat_interval_seconds=self.interval
            )
        finally:
            self.latency.record(time.perf_counter() - started)

    async def ReportEvent(self, request: pb.ReportEventRequest, context: Context) -> pb.ReportEventResponse:
        name = request.node_name
        await self._fence(name, request.incarnation, context)
        now = self.runner.clock.now()
        seen = self.runner.observed.get(name) or NodeObservation(request.incarnation, now)
        kind = request.WhichOneof("event")
        if kind == "eviction":
            await self.runner.observe(
                name, replace(seen, last_seen=now, eviction_not_before=request.eviction.not_before)
            )
        elif kind == "trainer_exited":
            await self._check_generations([request.trainer_exited.trainer], context)
            rank = convert.rank_from_pb(request.trainer_exited.trainer)
            others = tuple(
                r for r in seen.ranks if (r.job, r.generation, r.rank) != (rank.job, rank.generation, rank.rank)
            )
            await self.runner.observe(name, replace(seen, last_seen=now, ranks=(*others, rank)))
        elif kind == "checkpoint_committed":
            c = request.checkpoint_committed
            try:
                await self.runner.decide(
                    lambda world, t: agents.commit_checkpoint(world, c.job, c.generation, c.step, t)
                )
            except LookupError as exc:
                await _abort(context, grpc.StatusCode.NOT_FOUND, str(exc))
            except agents.Stale as exc:
                await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        else:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "event: set one of eviction, trainer_exited, checkpoint_committed",
            )
        return pb.ReportEventResponse(assignment=self._reply_assignment(name))
