"""The worker agent daemon: register, then heartbeat and converge, forever.

Each beat reports what the node observes (its trainers, a pending eviction notice) and receives the
assignment it should run; :func:`worker_agent.agent.converge.converge` turns that into commands the
:class:`~worker_agent.agent.supervisor.Supervisor` performs. Urgent facts (an eviction notice, a
trainer exit, a failed collective, a committed checkpoint) are also pushed at once with ``ReportEvent``. When the
controller is unreachable the trainers keep training and the agent retries with backoff as the same
incarnation, for as long as the trainers' lease holds (six heartbeat expiries unless ``lease_seconds``
says otherwise): every answered heartbeat renews it, and once the controller has been silent for longer
the agent kills its trainers, which also stop by themselves when the lease file goes stale (a frozen
agent). A controller that no longer knows this incarnation (it was LOST) makes it kill its trainers and
register anew, as a new incarnation, before anything new starts.

This module is the loop only: the calls are in :mod:`~worker_agent.agent.transport`, the wire format in
:mod:`~worker_agent.agent.wire` and every decision in :mod:`~worker_agent.agent.decisions`. The trainers'
logs go to the controller from a task of their own (:mod:`~worker_agent.agent.logs`), every interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from morphing.errors import UserInputError
from worker_agent.agent import decisions, refusals
from worker_agent.agent.converge import (
    Assignment,
    TrainerKey,
    accept,
    converge,
)
from worker_agent.agent.decisions import EvictionNotice, Pushed
from worker_agent.agent.gpus import Gpu, trainer_environment
from worker_agent.agent.logs import LogShipper
from worker_agent.agent.perform import perform
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.supervisor import LaunchSpec, Supervisor, kill_leftovers
from worker_agent.agent.transport import (
    CallFailed,
    CallRefused,
    ControllerLink,
    ControllerUnreachable,
    Endpoint,
    NodeOffer,
    RegisterAgain,
)
from worker_agent.agent.wakeup import TrainerWakeup
from worker_agent.agent.wire import Incoming, LogChunk, Registration
from worker_agent.agent.zygote import InheritedProcess
from worker_agent.contract import AgentWorkDir
from worker_agent.contract.wake import WAKE_ENV
from worker_agent.scheduled_events import (
    EvictionNoticed,
    EvictionPoller,
    EvictionWatcher,
    EvictionWithdrawn,
    ScheduledEventsClient,
    ScheduledEventsError,
)

log = logging.getLogger("spotmorph.agent")
LAST_LOGS_SECONDS = 2.0  # on the way out, how long the trainers' last lines may take to reach the controller


@dataclass(frozen=True)
class AgentConfig:
    controller: str
    token: str
    work_dir: Path
    slots: int = 1
    gpus: tuple[Gpu, ...] = ()  # slot i trains on gpus[i] (never more slots than GPUs: gpus.slot_count)
    name: str = ""
    address: str = "127.0.0.1"
    socket_interface: str | None = None  # the interface holding ``address``: trainers bind collectives to it
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
    lease_seconds: float | None = None  # None: six times the controller's heartbeat expiry
    zygote: InheritedProcess | None = None  # one this process started before it was the agent (a local VM's)


@dataclass
class AgentState:
    """What the agent remembers between beats (nothing here is needed to survive a restart)."""

    node: Registration
    interval: float = 1.0
    healthy: bool = True
    desired: Assignment | None = None
    launch: dict[tuple[str, int], LaunchSpec] = field(default_factory=dict)
    pushed: Pushed = field(default_factory=Pushed)
    notice: EvictionNotice | None = None
    last_contact: float = 0.0  # time.monotonic() of the controller's last answer
    withheld: refusals.Withheld = field(default_factory=refusals.Withheld)  # measurements the controller refused
    adjusted: set[tuple[TrainerKey, refusals.Measurement]] = field(default_factory=set)  # logged, each once


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.work_dir = AgentWorkDir(config.work_dir)
        env = trainer_environment(os.environ, config.gpus, config.socket_interface) or dict(os.environ)
        env[WAKE_ENV] = str(self.work_dir.trainers.wake_file)
        self.supervisor = Supervisor(
            self.work_dir.trainers.path,
            python=config.trainer_python,
            env=env,
            warm=config.warm_trainers,
            zygote=not config.gpus,  # a CPU node forks its warm trainers (forking after CUDA is initialised fails)
            inherited=config.zygote,
        )
        self.link = ControllerLink(Endpoint(config.controller, config.ca, config.cert, config.key))
        self.logs = LogShipper(self.work_dir.trainers, self._send_logs, self.supervisor.running)
        self.state = AgentState(Registration(config.name, 0, "", 1.0, 10.0))
        self._wake = asyncio.Event()
        self.wakeup = TrainerWakeup(self.work_dir.trainers.wake_file)  # a trainer's poke or exit: look now
        self._stopping = False
        self._acknowledging: asyncio.Task[None] | None = None  # the eviction acknowledgement in flight

    async def run(self) -> int:
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        kill_leftovers(self.work_dir.trainers)
        self.work_dir.pid_file.write_text(str(os.getpid()))
        self.wakeup.listen()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_shutdown)
        watcher = asyncio.create_task(self._watch_evictions()) if self.config.imds_url else None
        shipper: asyncio.Task[None] | None = None
        try:
            await self._register()
            shipper = asyncio.create_task(self._ship_logs())
            while not self._stopping:
                self.state.healthy = True
                again = await self._beat()
                if self.supervisor.settled():
                    self.supervisor.prewarm()
                self._wake.clear()
                if not again:
                    await self._pause()
        finally:
            for task in (watcher, self._acknowledging, shipper):
                if task is not None:
                    task.cancel()
            if shipper is not None:
                await asyncio.gather(shipper, return_exceptions=True)
            self.supervisor.kill_all()
            self.wakeup.close()
            if shipper is not None:
                await self._last_logs()
            await self.link.close()
        return 0

    async def _ship_logs(self) -> None:
        """The trainers' logs to the controller every interval, beside the heartbeats (never holding one up)."""
        said = False
        while True:
            await asyncio.sleep(self.state.interval)
            try:
                await self.logs.ship()
            except Exception:  # a bug must end neither the shipping nor the agent (logged once)
                if not said:
                    log.exception("shipping the trainers' logs failed; trying again every interval")
                said = True

    async def _last_logs(self) -> None:
        """What the trainers wrote last, before the node goes, if the controller takes it at once."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.logs.flush(), LAST_LOGS_SECONDS)

    async def _send_logs(self, chunks: list[LogChunk]) -> list[int]:
        node = self.state.node
        if not node.node_token:
            raise ControllerUnreachable("not registered")
        return await self.link.report_logs(node, chunks)

    async def _pause(self) -> None:
        """Wait for the next beat; a trainer that exits (or holds) is reported at once (the controller plans the
        next generation when the last one has), and an urgent fact wakes the loop too. The trainers are looked
        at every ``local_poll_seconds``, and at once when one pokes or exits (:mod:`.wakeup`)."""
        loop = asyncio.get_running_loop()
        interval = decisions.beat_interval(
            self.state.interval, self.state.desired, self.state.healthy, self.config.morph_beat_seconds
        )
        deadline = loop.time() + interval
        while (remaining := deadline - loop.time()) > 0:
            if await self.wakeup.wait(self._wake, min(remaining, self.config.local_poll_seconds)):
                return
            self.wakeup.poked.clear()  # the look below sees what every poke so far said; a later one wakes the next
            if self.supervisor.exited_since(set(self.state.pushed.exits)):
                return
            if self.supervisor.newly_held(set(self.state.pushed.held)):
                return  # a collective failed: the controller hears of it now, not at the next beat

    def _request_shutdown(self) -> None:
        self._stopping = True
        self._wake.set()

    async def _register(self) -> None:
        remembered = self.work_dir.node_name_file
        name = self.state.node.node_name
        if not name and remembered.exists():
            name = remembered.read_text().strip()
        offer = NodeOffer(
            name or self.config.name, self.config.slots, self.config.address, self.config.instance_id, self.config.gpus
        )
        node = await self.link.register(
            offer, self.config.token, lambda: self._stopping, self.config.max_backoff_seconds
        )
        if node is None:
            return
        self.state.node, self.state.interval = node, node.heartbeat_interval
        self.state.last_contact = time.monotonic()
        self.supervisor.lease_seconds = decisions.lease_seconds(self.config.lease_seconds, node.heartbeat_expiry)
        log.info("registered as %s incarnation %d", node.node_name, node.incarnation)
        remembered.write_text(node.node_name)

    def _reports(self) -> list[TrainerReport]:
        """The trainers' reports as they may be sent (:mod:`~worker_agent.agent.refusals`); each change logged once."""
        reports, adjustments = refusals.prepare(self.supervisor.reports(), self.state.withheld)
        for adjustment in adjustments:
            if (adjustment.key, adjustment.measurement) not in self.state.adjusted:
                self.state.adjusted.add((adjustment.key, adjustment.measurement))
                log.warning("report adjusted to the controller's bounds: %s", adjustment)
        return reports

    async def _beat(self) -> bool:
        """One heartbeat; True when the controller held its reply for a change, so the next one goes at once."""
        reports = self._reports()
        await self._push_urgent(reports)
        self._acknowledge_notice_if_done(reports)
        wait = decisions.heartbeat_wait(running=bool(self.supervisor.running()))
        try:
            building = self.supervisor.building()
            reply = await self.link.heartbeat(self.state.node, reports, self.state.notice, building, wait)
        except UserInputError as exc:
            log.error("the controller's assignment is unusable: %s", exc)
            return False
        except CallRefused as exc:
            # Never an exit: the next node to take this job would be refused the same (a crash loop).
            self.state.withheld, line = refusals.after_refusal(exc.detail, reports, self.state.withheld)
            log.error("heartbeat refused (%s): %s", exc.code, line)
            self._stop_trainers_if_lease_lapsed()
            return False
        except ControllerUnreachable as exc:
            log.warning("heartbeat failed (%s); trainers keep running", exc)
            self.state.healthy = False
            self.state.interval = decisions.backed_off_interval(
                self.state.interval, self.config.max_backoff_seconds, self.state.node.heartbeat_expiry
            )
            self._stop_trainers_if_lease_lapsed()
            return False
        except RegisterAgain as exc:
            log.warning("controller no longer knows this incarnation (%s); registering anew", exc)
            self.supervisor.kill_all()
            await self._register()
            return False
        self.state.last_contact = time.monotonic()
        if reply.heartbeat_interval is not None:
            self.state.interval = reply.heartbeat_interval
        self._apply(reply.incoming)
        if reply.prepare is not None and reply.incoming.assignment.action == "idle":
            self.supervisor.prepare(reply.prepare.job_id, reply.prepare.spec)
        desired = self.state.desired
        if desired is not None and desired.action in ("run", "stop"):
            self.supervisor.renew_leases(desired.job_id, desired.generation)
            # The controller takes the checkpoints of its current generation from this heartbeat.
            current = (desired.job_id, desired.generation)
            steps = [
                r.last_checkpoint_step or 0
                for r in reports
                if (r.status.key.job_id, r.status.key.generation) == current
            ]
            self.supervisor.acknowledge(desired.job_id, desired.generation, max(steps, default=0))
        return reply.waited

    def _stop_trainers_if_lease_lapsed(self) -> None:
        lease = self.supervisor.lease_seconds
        if lease is None or not decisions.lease_lapsed(self.state.last_contact, time.monotonic(), lease):
            return
        for key in self.supervisor.running():
            log.warning("no answer from the controller for over %.1f s (the lease): killing %s", lease, key)
            self.supervisor.kill(key)

    def _apply(self, incoming: Incoming) -> None:
        """Converge to ``incoming`` against the trainers as they are now (an urgent report may just have
        started some, so a list taken before it would start them twice)."""
        wanted = incoming.assignment
        if not accept(self.state.desired, wanted):
            log.warning("ignoring stale assignment generation %d", wanted.generation)
            return
        if incoming.launch is not None:
            self.state.launch[(wanted.job_id, wanted.generation)] = incoming.launch
        self.state.desired = wanted
        leaving = self.state.notice is not None
        for command in converge(wanted, (r.status for r in self.supervisor.reports())):
            perform(command, self.supervisor, self.config.gpus, self.config.slots, self.state.launch, leaving)
        keep = {(wanted.job_id, wanted.generation)}
        self.supervisor.forget(keep)
        self.state.launch = {k: v for k, v in self.state.launch.items() if k in keep}

    async def _push_urgent(self, reports: list[TrainerReport]) -> None:
        """Trainer exits and newly committed checkpoints, each pushed once."""
        facts, self.state.pushed = decisions.urgent_facts(reports, self.state.pushed)
        for fact in facts:
            await self._report(fact)

    async def _report(self, fact: decisions.UrgentFact | EvictionNotice) -> None:
        try:
            incoming = await self.link.report_event(self.state.node, fact)
        except CallFailed as exc:
            log.warning("report failed (%s); the next heartbeat carries the same facts", exc)
            return
        except UserInputError as exc:
            log.error("the controller's assignment is unusable: %s", exc)
            return
        if isinstance(fact, decisions.CheckpointCommitted):
            self.supervisor.acknowledge(fact.job_id, fact.generation, fact.step)  # committed, else it was refused
        if incoming is not None:
            self._apply(incoming)

    def _acknowledge_notice_if_done(self, reports: list[TrainerReport]) -> None:
        notice = self.state.notice
        if self.config.imds_url is None or notice is None:
            return
        if not decisions.may_acknowledge(notice, reports, self.state.desired):
            return
        if self._acknowledging is not None and not self._acknowledging.done():
            return  # one acknowledgement in flight at a time; the loop never waits on the metadata service
        self._acknowledging = asyncio.create_task(self._acknowledge(self.config.imds_url, notice))

    async def _acknowledge(self, imds_url: str, notice: EvictionNotice) -> None:
        await self._last_logs()  # the platform may take the VM as soon as it is acknowledged
        try:
            await asyncio.to_thread(ScheduledEventsClient(imds_url).acknowledge, notice.event_id)
        except ScheduledEventsError as exc:
            log.warning("could not acknowledge eviction: %s", exc)
            return
        if self.state.notice is not None and self.state.notice.event_id == notice.event_id:
            self.state.notice = replace(self.state.notice, acknowledged=True)
        log.info("acknowledged eviction %s: this node's trainers are stopped", notice.event_id)

    async def _watch_evictions(self) -> None:
        assert self.config.imds_url is not None
        watcher = EvictionWatcher(self.config.vm_name or self.state.node.node_name or self.config.name)
        poller = EvictionPoller(ScheduledEventsClient(self.config.imds_url), watcher)
        while True:
            if not watcher.vm_name:
                watcher.vm_name = self.state.node.node_name
            for fact in await asyncio.to_thread(poller.poll):
                pending = self.state.notice
                if isinstance(fact, EvictionWithdrawn) and pending is not None and pending.event_id == fact.event_id:
                    log.warning("eviction %s withdrawn (%s): this node stays", fact.event_id, fact.reason)
                    self.state.notice = None  # heartbeats stop carrying it
                    self._wake.set()
                if isinstance(fact, EvictionNoticed) and self.state.notice is None:
                    not_before = fact.not_before.timestamp() if fact.not_before else None
                    deadline = decisions.notice_deadline(not_before, time.time())
                    self.state.notice = EvictionNotice(fact.event_id, deadline)
                    log.warning("eviction notice %s: gone at %s", fact.event_id, fact.not_before)
                    await self._report(self.state.notice)
                    self._wake.set()
            await asyncio.sleep(self.config.poll_seconds)
