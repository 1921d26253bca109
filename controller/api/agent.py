"""The Agent service: registration, heartbeats, urgent reports and trainer logs from the nodes' agents.

Every call of a node is fenced first (its token, its incarnation) and its fields checked
(:mod:`controller.api.reports`: the jobs, generations, ranks and steps it reports); what it observed
goes to the runner, and the reply is its assignment as the view sees it after that. A registration
binds its name to the instance that made it: the instance its per-VM agent token was issued to (a
request naming another is refused), plus the client certificate under mutual TLS. While that node is
alive, only the same instance may register the name again (PERMISSION_DENIED for anyone else). With the
shared agent token (where enabled) the instance id or address is only claimed, and bound as unverified.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace

import grpc

from controller.api import logs, reports, wire
from controller.api.auth import Principal, Role, Tokens, principal_of
from controller.api.leader_gate import Leading, refuse_not_leader
from controller.api.status import Context, abort, abort_for, answered
from controller.api.writes import Writes
from controller.core import intake
from controller.core.model import Command, JobRecord, NodeObservation, NodeRecord, World, ranks_by_node
from controller.core.stimulus import AGENT, Stimulus
from controller.shell.latency import Histogram
from controller.shell.logbook import LogBook
from controller.shell.views import StateView
from morphing.jobspec import JobSpec
from morphing.layout import Layout
from morphing.validation import shown
from protos.jobspec import spec_to_pb
from protos.reasons import REGISTER_AGAIN
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc

REPORT = "ReportEvent"  # the RPC, as a decision it triggers records it
SOON_BEAT_SECONDS = 0.2  # how often a free node that may get work within seconds beats (as a morphing one does)


def certificate_name(context: Context) -> str | None:
    """The common name of the client certificate (mutual TLS), if the caller presented one."""
    names = list(context.auth_context().get("x509_common_name") or ())
    return names[0].decode(errors="replace") if names else None


class AgentService(rpc.AgentServicer):
    def __init__(
        self,
        view: StateView,
        writes: Writes,
        tokens: Tokens,
        interval: float,
        latency: Histogram | None = None,
        *,
        logbook: LogBook,
        leadership: Leading | None = None,
        on_registered: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_registered``: called after each registration (the daemon lists the provider's VMs at once, so a VM's
        pool is known before arrivals settle and anything is decided on it)."""
        self.view = view
        self.on_registered = on_registered
        self.writes = writes
        self.tokens = tokens
        self.logbook = logbook
        self.leadership = leadership  # None: the only controller, leading for its life (tests, epoch 0)
        self.interval = interval
        self.latency = latency or Histogram()  # time inside Heartbeat, shown in GetClusterState
        self._replies: dict[str, tuple[NodeRecord | None, JobRecord | None, pb.Assignment | None]] = {}
        self._layouts: dict[str, tuple[Layout, JobSpec, pb.Layout | None, pb.JobSpec, dict[str, tuple[int, ...]]]] = {}
        self._prepared: dict[str, tuple[JobSpec, pb.Prepare]] = {}  # the hint last sent to free nodes, on the wire

    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.RegisterResponse:
        registered: list[NodeRecord] = []
        async with answered(context):
            reports.registration(request)
            gpus = wire.gpus_from_pb(request.gpus)
            instance = await self._instance(request, context)

            def decide(world: World, now: float) -> list[Command]:
                node, commands = intake.register(
                    world, request.node_name, request.slots, request.address, now, instance, gpus, self.view.damping
                )
                registered.append(node)
                return commands

            await self.writes.decide(
                decide, Stimulus.node_call("Register", request.node_name or None, None, caller=AGENT)
            )
        self.on_registered()
        node = registered[0]
        return pb.RegisterResponse(
            node_name=node.name,
            incarnation=node.incarnation,
            node_token=self.tokens.node_token(node.name, node.incarnation),
            heartbeat_interval_seconds=self.interval,
            heartbeat_expiry_seconds=self.view.heartbeat_expiry_seconds,
            epoch=await self._epoch(context),
        )

    async def _epoch(self, context: Context) -> int:
        """The epoch a reply carries; a controller that stepped down while the call ran refuses it instead."""
        if self.leadership is None:
            return 0
        if not self.leadership.leading:
            await refuse_not_leader(context, self.leadership.leader_address())
        return self.leadership.epoch

    async def _instance(self, request: pb.RegisterRequest, context: Context) -> str:
        """Who registers: the instance its token proves, or (shared token) what it claims, unverified."""
        principal = principal_of(context, self.tokens)
        proven = principal.instance if principal is not None else None
        certificate = certificate_name(context)
        if proven is None:
            return intake.instance_of(request.instance_id, request.address, certificate, proven=False)
        if request.instance_id and request.instance_id != proven:
            await abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"this agent token is instance {proven}'s; it may not register as instance_id "
                f"{shown(request.instance_id)} (leave instance_id empty or give this VM its own token)",
            )
        return intake.instance_of(proven, request.address, certificate)

    async def _fence(self, name: str, incarnation: int, context: Context) -> None:
        principal: Principal | None = principal_of(context, self.tokens)
        if principal is None or principal.role is not Role.NODE or principal.node != name:
            await abort(context, grpc.StatusCode.PERMISSION_DENIED, f"this token may not act as node {shown(name)}")
        if principal.incarnation != incarnation:
            code, detail = grpc.StatusCode.FAILED_PRECONDITION, "token and incarnation differ; register again"
            await abort(context, code, detail, REGISTER_AGAIN)
        try:
            self.view.check_incarnation(name, incarnation)
        except (LookupError, intake.Stale) as exc:
            await abort_for(context, exc, REGISTER_AGAIN)  # forgotten or replaced: this incarnation is over

    def _reply_assignment(self, name: str) -> pb.Assignment | None:
        """The node's assignment on the wire, rebuilt only when its node or job record changed.

        Records are immutable and replaced on every change, so identity says "unchanged". The parts that
        are the same for every node of a generation (layout JSON, spec, who runs which rank) are built
        once per layout, not once per heartbeat: for a job on 1,000 nodes they are O(nodes) each.
        """
        node = self.view.node(name)
        job = self.view.job(node.job) if node is not None and node.job is not None else None
        hit = self._replies.get(name)
        if hit is not None and hit[0] is node and hit[1] is job:
            return hit[2]
        layout_pb: pb.Layout | None = None
        spec_pb: pb.JobSpec | None = None
        ranks_of: dict[str, tuple[int, ...]] | None = None
        if job is not None and job.layout is not None:
            found = self._layouts.get(job.id)
            if found is None or found[0] is not job.layout or found[1] is not job.spec:
                layout_pb, spec_pb = wire.layout_to_pb(job.layout), spec_to_pb(job.spec)
                found = (job.layout, job.spec, layout_pb, spec_pb, ranks_by_node(job.layout))
                self._layouts[job.id] = found
            _, _, layout_pb, spec_pb, ranks_of = found
        assignment = self.view.assignment(name, ranks_of)
        key = self.tokens.rendezvous_key(assignment.job, assignment.generation) if assignment is not None else ""
        reply = wire.assignment_to_pb(assignment, layout_pb, spec_pb, key)
        self._replies[name] = (node, job, reply)
        return reply

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context) -> pb.HeartbeatResponse:
        started, waited = time.perf_counter(), 0.0
        try:
            await self._fence(request.node_name, request.incarnation, context)
            async with answered(context):
                wait = reports.wait_seconds(request.wait_seconds)
                ranks = reports.trainers(self.view, request.node_name, request.trainers)
                notice = reports.notice("eviction", request.eviction) if request.HasField("eviction") else None
                building = reports.building(self.view, request.building)
                now = self.view.now()
                risk = reports.risk(request.risk, now) if request.HasField("risk") else None
                seen = NodeObservation(request.incarnation, now, ranks, notice, building, risk)
                await self.writes.observe(request.node_name, seen)
            changed = self.view.next_change()  # taken before the reply is read: no commit after it goes unseen
            reply, awaits_work = self._heartbeat_reply(request.node_name)
            if wait > 0 and awaits_work:
                waiting = time.perf_counter()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
                waited = time.perf_counter() - waiting
                reply, _ = self._heartbeat_reply(request.node_name)
                reply.waited = True
            reply.epoch = await self._epoch(context)
            return reply
        finally:
            self.latency.record(time.perf_counter() - started - waited)

    def _heartbeat_reply(self, name: str) -> tuple[pb.HeartbeatResponse, bool]:
        """The node's reply as things stand, and whether work may reach it within seconds: a free node a growth
        may take, or a node of a morphing job whose trainers stopped (its next generation comes in a reply)."""
        assignment = self._reply_assignment(name)
        hint = None if assignment is not None else self.view.growth_hint(name)
        prepare = None if hint is None else self._prepare(*hint)
        soon = assignment is None and self.view.assignment_soon(name, hint is not None)
        interval = min(self.interval, SOON_BEAT_SECONDS) if soon else self.interval
        between = assignment is not None and assignment.action in (pb.ACTION_STOP, pb.ACTION_ABORT)
        reply = pb.HeartbeatResponse(assignment=assignment, heartbeat_interval_seconds=interval, prepare=prepare)
        return reply, soon or between

    def _prepare(self, job_id: str, spec: JobSpec) -> pb.Prepare:
        """What a free node's warm trainers may build ahead (:func:`controller.core.reconcile.growth.growth_hint`);
        the wire form is built once per spec, not once per heartbeat."""
        cached = self._prepared.get(job_id)
        if cached is None or cached[0] != spec:
            cached = (spec, pb.Prepare(job=job_id, spec=spec_to_pb(spec), entrypoint=spec.entrypoint))
            self._prepared = {job_id: cached}  # one job is hinted at a time, mostly: no cache to grow
        return cached[1]

    async def ReportEvent(self, request: pb.ReportEventRequest, context: Context) -> pb.ReportEventResponse:
        name = request.node_name
        await self._fence(name, request.incarnation, context)
        now = self.view.now()
        seen = self.view.observation(name)
        if seen is None or seen.incarnation != request.incarnation:  # what an older incarnation said is void
            seen = NodeObservation(request.incarnation, now)
        kind = request.WhichOneof("event")
        async with answered(context):
            if kind == "eviction":
                not_before = reports.notice("eviction", request.eviction)
                await self.writes.observe(name, replace(seen, last_seen=now, eviction_not_before=not_before), REPORT)
            elif kind == "trainer_exited":
                ranks = reports.exited(self.view, name, request.trainer_exited.trainer, seen.ranks)
                await self.writes.observe(name, replace(seen, last_seen=now, ranks=ranks), REPORT)
            elif kind == "collective_failed":
                ranks = reports.collective_failed(self.view, name, request.collective_failed, seen.ranks)
                await self.writes.observe(name, replace(seen, last_seen=now, ranks=ranks), REPORT)
            elif kind == "checkpoint_committed":
                c = request.checkpoint_committed
                reports.checkpoint(self.view, name, c)
                await self.writes.decide(
                    lambda world, t: intake.commit_checkpoint(world, c.job, c.generation, c.step, t),
                    Stimulus.node_call(REPORT, name, request.incarnation, job=c.job),
                )
            else:
                await abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "event: set one of eviction, trainer_exited, checkpoint_committed, collective_failed",
                )
        return pb.ReportEventResponse(assignment=self._reply_assignment(name), epoch=await self._epoch(context))

    async def ReportLogs(self, request: pb.ReportLogsRequest, context: Context) -> pb.ReportLogsResponse:
        """The node's trainers' logs: stored off the event loop, never in a decision; the reply says how far
        the controller has each file, so the agent sends on from there (after a restart or a refusal too)."""
        await self._fence(request.node_name, request.incarnation, context)
        async with answered(context):
            chunks = logs.chunks(self.view, request)
            offsets = await self.logbook.append(request.node_name, chunks, self.view.now()) if chunks else []
        return logs.offsets_to_pb(chunks, offsets)
