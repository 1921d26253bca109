"""The worker agent daemon: register, then heartbeat and converge, forever.

Each beat reports what the node observes (its trainers, a pending eviction notice) and receives the
assignment it should run; :func:`worker_agent.agent.converge.converge` turns that into commands the
:class:`~worker_agent.agent.supervisor.Supervisor` performs. Urgent facts (an eviction notice, a
trainer exit, a committed checkpoint) are also pushed at once with ``ReportEvent``. When the
controller is unreachable the trainers keep training and the agent retries with backoff as the same
incarnation; only a controller that no longer knows this incarnation makes it register anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from morphing.jobspec import parse_job_spec
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as pb_grpc
from worker_agent.agent.converge import (
    Assignment,
    KillTrainer,
    RequestStop,
    StartTrainer,
    TrainerKey,
    accept,
    converge,
)
from worker_agent.agent.supervisor import LaunchSpec, Supervisor, TrainerReport
from worker_agent.contract import AgentWorkDir
from worker_agent.scheduled_events import (
    EvictionNoticed,
    EvictionWatcher,
    ScheduledEventsClient,
    ScheduledEventsError,
)

log = logging.getLogger("spotmorph.agent")

ACTIONS = {pb.ACTION_RUN: "run", pb.ACTION_STOP: "stop", pb.ACTION_ABORT: "abort"}
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL}


@dataclass(frozen=True)
class AgentConfig:
    controller: str
    token: str
    work_dir: Path
    slots: int = 1
    name: str = ""
    address: str = "127.0.0.1"
    instance_id: str = ""
    imds_url: str | None = None
    vm_name: str | None = None
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    poll_seconds: float = 1.0
    max_backoff_seconds: float = 10.0
    warm_trainers: int = 0
    trainer_python: str = sys.executable
    local_poll_seconds: float = 0.1
    morph_beat_seconds: float = 0.2


@dataclass
class _Identity:
    name: str = ""
    incarnation: int = 0
    node_token: str = ""
    interval: float = 1.0
    expiry: float = 10.0  # the controller declares a node LOST after this much silence


@dataclass
class _Notice:
    event_id: str
    not_before: float
    reported: bool = False
    acknowledged: bool = False


@dataclass
class AgentState:
    """What the agent remembers between beats (nothing here is needed to survive a restart)."""

    desired: Assignment | None = None
    launch: dict[tuple[str, int], LaunchSpec] = field(default_factory=dict)
    exits_reported: set[TrainerKey] = field(default_factory=set)
    checkpoints_reported: dict[tuple[str, int], int] = field(default_factory=dict)
    notice: _Notice | None = None


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.work_dir = AgentWorkDir(config.work_dir)
        self.supervisor = Supervisor(
            self.work_dir.trainers.path, python=config.trainer_python, warm=config.warm_trainers
        )
        self.state = AgentState()
        self.identity = _Identity(name=config.name)
        self._wake = asyncio.Event()
        self._stopping = False
        self._healthy = True
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None  # grpc-stubs types the stub as synchronous; it is an aio stub

    async def run(self) -> int:
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        _kill_leftovers(self.work_dir)
        self._write_pid()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_shutdown)
        watcher = asyncio.create_task(self._watch_evictions()) if self.config.imds_url else None
        try:
            await self._register()
            while not self._stopping:
                self._healthy = True
                await self._beat()
                if self.supervisor.settled():
                    self.supervisor.prewarm()
                self._wake.clear()
                await self._pause()
        finally:
            if watcher:
                watcher.cancel()
            self.supervisor.kill_all()
            if self._channel is not None:
                await self._channel.close(None)
        return 0

    async def _pause(self) -> None:
        """Wait for the next beat: the heartbeat interval, or less when it matters. A trainer that exits
        is reported at once (the controller plans the next generation when the last one has), and while
        a morph is under way (this node's trainers are asked to stop or abort) the agent beats often,
        because the next generation's assignment only reaches it in a heartbeat reply."""
        loop = asyncio.get_running_loop()
        interval = self.identity.interval
        desired = self.state.desired
        if self._healthy and desired is not None and desired.action in ("stop", "abort"):
            interval = min(interval, self.config.morph_beat_seconds)
        deadline = loop.time() + interval
        while (remaining := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(remaining, self.config.local_poll_seconds))
                return
            if self.supervisor.exited_since(self.state.exits_reported):
                return

    def _request_shutdown(self) -> None:
        self._stopping = True
        self._wake.set()

    def _write_pid(self) -> None:
        self.work_dir.pid_file.write_text(str(os.getpid()))

    def _stub_now(self) -> Any:
        if self._stub is None:
            options = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000)]
            if self.config.ca:
                creds = grpc.ssl_channel_credentials(
                    self.config.ca.read_bytes(),
                    self.config.key.read_bytes() if self.config.key else None,
                    self.config.cert.read_bytes() if self.config.cert else None,
                )
                self._channel = grpc.aio.secure_channel(self.config.controller, creds, options=options)
            else:
                self._channel = grpc.aio.insecure_channel(self.config.controller, options=options)
            self._stub = pb_grpc.AgentStub(self._channel)
        return self._stub

    def _auth(self, token: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {token}"),)

    async def _register(self) -> None:
        remembered = self.work_dir.node_name_file
        if not self.identity.name and remembered.exists():
            self.identity.name = remembered.read_text().strip()
        backoff = 0.2
        while not self._stopping:
            try:
                reply = await self._stub_now().Register(
                    pb.RegisterRequest(
                        node_name=self.identity.name or self.config.name,
                        slots=self.config.slots,
                        address=self.config.address,
                        instance_id=self.config.instance_id,
                    ),
                    metadata=self._auth(self.config.token),
                    timeout=10,
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRYABLE:
                    raise
                log.warning("controller unreachable (%s); retrying in %.1fs", exc.code().name, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.config.max_backoff_seconds)
                continue
            self.identity = _Identity(
                reply.node_name,
                reply.incarnation,
                reply.node_token,
                reply.heartbeat_interval_seconds or 1.0,
                reply.heartbeat_expiry_seconds or 10.0,
            )
            log.info("registered as %s incarnation %d", reply.node_name, reply.incarnation)
            self.work_dir.node_name_file.write_text(reply.node_name)
            return

    async def _beat(self) -> None:
        reports = self.supervisor.reports()
        await self._push_urgent(reports)
        self._acknowledge_notice_if_done(reports)
        request = pb.HeartbeatRequest(
            node_name=self.identity.name,
            incarnation=self.identity.incarnation,
            trainers=[_status(r) for r in reports],
        )
        if self.state.notice is not None:
            request.eviction.CopyFrom(pb.EvictionNotice(not_before=self.state.notice.not_before, source="imds"))
        try:
            reply = await self._call("Heartbeat", request)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in RETRYABLE:
                log.warning("heartbeat failed (%s); trainers keep running", exc.code().name)
                self._healthy = False
                # Back off, but never so far that a restarted controller finds this node silent for
                # longer than its expiry and declares it LOST.
                cap = min(self.config.max_backoff_seconds, self.identity.expiry / 3)
                self.identity.interval = min(self.identity.interval * 2, cap)
                return
            if _must_register_again(exc):
                log.warning("controller no longer knows this incarnation (%s); registering anew", exc.details())
                self.supervisor.kill_all()
                self.identity.name = self.identity.name or self.config.name
                await self._register()
                return
            raise
        if reply.heartbeat_interval_seconds:
            self.identity.interval = reply.heartbeat_interval_seconds
        self._apply(reply.assignment if reply.HasField("assignment") else None)

    async def _call(self, method: str, request: Any) -> Any:
        call = getattr(self._stub_now(), method)
        return await call(request, metadata=self._auth(self.identity.node_token), timeout=10)

    def _apply(self, message: Any) -> None:
        """Converge to ``message`` against the trainers as they are now (an urgent report may just have
        started some, so a list taken before it would start them twice)."""
        incoming = _assignment(message)
        if incoming is None:
            incoming = Assignment("", 0, "idle")
        elif not accept(self.state.desired, incoming):
            log.warning("ignoring stale assignment generation %d", incoming.generation)
            return
        if incoming.action != "idle":
            self.state.launch[(incoming.job_id, incoming.generation)] = _launch_spec(message)
        self.state.desired = incoming
        for command in converge(incoming, (r.status for r in self.supervisor.reports())):
            if isinstance(command, StartTrainer):
                spec = self.state.launch[(command.key.job_id, command.key.generation)]
                log.info("starting %s", command.key)
                self.supervisor.start(command.key, spec)
            elif isinstance(command, RequestStop):
                log.info("asking generation %d of %s to stop", command.generation, command.job_id)
                self.supervisor.request_stop(command.job_id, command.generation)
            elif isinstance(command, KillTrainer):
                log.info("killing %s: %s", command.key, command.reason)
                self.supervisor.kill(command.key)
        keep = {(incoming.job_id, incoming.generation)}
        self.supervisor.forget(keep)
        self.state.launch = {k: v for k, v in self.state.launch.items() if k in keep}

    async def _push_urgent(self, reports: Iterable[TrainerReport]) -> None:
        """Trainer exits and newly committed checkpoints, each pushed once."""
        for report in reports:
            key = report.status.key
            if not report.status.running and key not in self.state.exits_reported:
                self.state.exits_reported.add(key)
                await self._report(pb.ReportEventRequest(trainer_exited=pb.TrainerExited(trainer=_status(report))))
            step = report.last_checkpoint_step
            generation = (key.job_id, key.generation)
            if key.rank == 0 and step is not None and step > self.state.checkpoints_reported.get(generation, -1):
                self.state.checkpoints_reported[generation] = step
                event = pb.CheckpointCommitted(job=key.job_id, generation=key.generation, step=step)
                await self._report(pb.ReportEventRequest(checkpoint_committed=event))

    async def _report(self, request: Any) -> None:
        request.node_name = self.identity.name
        request.incarnation = self.identity.incarnation
        try:
            reply = await self._call("ReportEvent", request)
        except grpc.aio.AioRpcError as exc:
            log.warning("report failed (%s); the next heartbeat carries the same facts", exc.code().name)
            return
        if reply.HasField("assignment"):
            self._apply(reply.assignment)

    def _acknowledge_notice_if_done(self, reports: list[TrainerReport]) -> None:
        """Tell the platform it may evict now: nothing runs here and what ran stopped cleanly (its
        checkpoint is written), so waiting for ``NotBefore`` would only waste the notice."""
        notice = self.state.notice
        if notice is None or notice.acknowledged or self.config.imds_url is None:
            return
        if any(r.status.running for r in reports):
            return
        if any(r.status.exit_code not in (None, 0) for r in reports) and self.state.desired is not None:
            return
        try:
            ScheduledEventsClient(self.config.imds_url).acknowledge(notice.event_id)
            notice.acknowledged = True
            log.info("acknowledged eviction %s: this node's trainers are stopped", notice.event_id)
        except ScheduledEventsError as exc:
            log.warning("could not acknowledge eviction: %s", exc)

    async def _watch_evictions(self) -> None:
        assert self.config.imds_url is not None
        client = ScheduledEventsClient(self.config.imds_url)
        watcher = EvictionWatcher(self.config.vm_name or self.identity.name or self.config.name)
        while True:
            if not watcher.vm_name:
                watcher.vm_name = self.identity.name
            try:
                document = await asyncio.to_thread(client.fetch)
            except ScheduledEventsError as exc:
                log.debug("scheduled events: %s", exc)
            else:
                for fact in watcher.observe(document):
                    if isinstance(fact, EvictionNoticed) and self.state.notice is None:
                        not_before = fact.not_before.timestamp() if fact.not_before else time.time()
                        self.state.notice = _Notice(fact.event_id, not_before)
                        log.warning("eviction notice %s: gone at %s", fact.event_id, fact.not_before)
                        notice = pb.EvictionNotice(not_before=not_before, source="azure-scheduled-events")
                        await self._report(pb.ReportEventRequest(eviction=notice))
                        self._wake.set()
            await asyncio.sleep(self.config.poll_seconds)


def _must_register_again(exc: grpc.aio.AioRpcError) -> bool:
    """The controller no longer accepts this incarnation (forgotten, replaced or its token unknown)."""
    code = exc.code()
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND):
        return True
    return code is grpc.StatusCode.FAILED_PRECONDITION and "register again" in (exc.details() or "")


def _assignment(message: Any) -> Assignment | None:
    if message is None or not message.job:
        return None
    return Assignment(message.job, message.generation, ACTIONS.get(message.action, "idle"), tuple(message.ranks))  # type: ignore[arg-type]


def _launch_spec(message: Any) -> LaunchSpec:
    fields = {
        field.name: getattr(message.spec, field.name)
        for field in message.spec.DESCRIPTOR.fields
        if not field.has_presence or message.spec.HasField(field.name)
    }
    if message.entrypoint:
        fields["entrypoint"] = message.entrypoint
    job = parse_job_spec(fields, what=f"job spec of {message.job}")
    checkpoint_dir = Path(message.checkpoint_dir)
    load_from = str(checkpoint_dir / f"step-{message.resume_step:08d}") if message.resume_step else None
    return LaunchSpec(job, json.loads(message.layout.json), message.rendezvous_endpoint, checkpoint_dir, load_from)


def _status(report: TrainerReport) -> Any:
    key = report.status.key
    status = pb.TrainerStatus(
        job=key.job_id,
        generation=key.generation,
        rank=key.rank,
        running=report.status.running,
        last_step=report.step,
        last_checkpoint_step=report.last_checkpoint_step or 0,
        error=report.error[-1000:],
    )
    if report.status.exit_code is not None:
        status.exit_code = report.status.exit_code
    return status


def _kill_leftovers(work_dir: AgentWorkDir) -> None:
    """Trainers a previous incarnation of this agent left behind must never join a new generation."""
    for pid_file in work_dir.trainers.pid_files():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
    for spool in work_dir.trainers.warm_spools():
        with contextlib.suppress(OSError, ValueError, ProcessLookupError, PermissionError):
            os.killpg(int(spool.pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(work_dir.trainers.warm_root, ignore_errors=True)
