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
register anew, as a new incarnation, before anything new starts. With several controllers, calls go to the one
that leads and move on when it does not (:mod:`~worker_agent.agent.transport`), as the same incarnation.

An eviction notice is the controller's to act on (it stops the generation, planning the next without this
node); one no controller has heard of within ``alone_after_seconds`` makes the trainers stop on their own,
leaving, as the controller would have asked (:func:`~worker_agent.agent.decisions.stop_alone`), and the first
heartbeat a controller answers afterwards carries the notice and how the trainers stopped
(:mod:`~worker_agent.agent.evictions`). Notices come from the cloud's metadata service (``--cloud``), and on GCP
also as the SIGTERM of the guest's shutdown, which the agent takes as a notice before it exits. The cloud's early
warning of an eviction (AWS's rebalance recommendation) rides on every heartbeat while it stands.

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
import time

from morphing.errors import UserInputError
from worker_agent.agent import decisions, refusals
from worker_agent.agent.config import AgentConfig, AgentState
from worker_agent.agent.converge import RequestStop, accept, converge
from worker_agent.agent.decisions import EvictionNotice
from worker_agent.agent.evictions import Evictions, NoticeHooks
from worker_agent.agent.gpus import trainer_environment
from worker_agent.agent.holders import kill_leftovers
from worker_agent.agent.logs import LogShipper
from worker_agent.agent.perform import perform
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.supervisor import Supervisor
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
from worker_agent.contract import AgentWorkDir
from worker_agent.contract.wake import WAKE_ENV
from worker_agent.notices import gcp

__all__ = ["Agent", "AgentConfig"]  # AgentConfig lives in config.py; callers take both from here

log = logging.getLogger("spotmorph.agent")
LAST_LOGS_SECONDS = 2.0  # on the way out, how long the trainers' last lines may take to reach the controller


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
        self.link = ControllerLink(Endpoint(config.controllers, config.ca, config.cert, config.key))
        self.logs = LogShipper(self.work_dir.trainers, self._send_logs, self.supervisor.running)
        self.state = AgentState(Registration(config.name, 0, "", 1.0, 10.0))
        self._wake = asyncio.Event()
        self.wakeup = TrainerWakeup(self.work_dir.trainers.wake_file)  # a trainer's poke or exit: look now
        self._stopping = False
        self._drain_until: float | None = None  # a SIGTERM taken as a notice (--cloud gcp): exit by then at the latest
        self._draining: asyncio.Task[None] | None = None
        self._told_running = True  # the last heartbeat a controller answered said a trainer here runs
        hooks = NoticeHooks(lambda n: self._report(n), self._wake.set, self._stop_alone_if_due, self._last_logs)
        self.evictions = Evictions(config, self.state, hooks)

    async def run(self) -> int:
        self.config.work_dir.mkdir(parents=True, exist_ok=True)
        kill_leftovers(self.work_dir.trainers)
        self.work_dir.pid_file.write_text(str(os.getpid()))
        self.wakeup.listen()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._terminated)
        loop.add_signal_handler(signal.SIGINT, self._request_shutdown)
        watcher = asyncio.create_task(self.evictions.watch()) if self.evictions.source is not None else None
        shipper: asyncio.Task[None] | None = None
        try:
            await self._register()
            shipper = asyncio.create_task(self._ship_logs())
            while not self._stopping:
                self.state.healthy = True
                again = await self._beat()
                self._exit_if_drained()
                if self.supervisor.settled():
                    self.supervisor.prewarm()
                self._wake.clear()
                if not again:
                    await self._pause()
        finally:
            self.evictions.close()
            for task in (watcher, shipper, self._draining):
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

    def _terminated(self) -> None:
        """SIGTERM. On GCP the guest's shutdown is how a preemption reaches a VM (30 s before it stops), so the first
        one is a notice: the agent goes on until its trainers have left (:func:`~.decisions.drained`); elsewhere, and
        at a second SIGTERM, it stops at once (its trainers killed), as before."""
        if self.config.cloud != "gcp" or self._drain_until is not None:
            self._request_shutdown()
            return
        self._drain_until = time.time() + gcp.NOTICE_SECONDS
        log.warning(
            "SIGTERM: the guest is shutting down (a GCP preemption, or a stop): taken as an eviction notice; exiting "
            "once this node's trainers have left and a controller heard, within %.0f s (a second SIGTERM: at once)",
            gcp.NOTICE_SECONDS,
        )
        self._draining = asyncio.create_task(self.evictions.shutdown_notice())
        asyncio.get_running_loop().call_later(gcp.NOTICE_SECONDS, self._request_shutdown)  # wherever the loop is then
        self._wake.set()

    def _exit_if_drained(self) -> None:
        if self._drain_until is None:
            return
        state = self.state
        untold = state.stopped_alone is not None
        # What a controller last heard, not what runs now: a trainer that just left is reported before the agent
        # goes, or the controller takes it for lost (and the step it handed off with it).
        running = self._told_running
        if decisions.drained(state.notice, state.notice_heard(), untold, running, time.time(), self._drain_until):
            log.warning("this node's trainers have left (or the shutdown's %.0f s are up): exiting", gcp.NOTICE_SECONDS)
            self._stopping = True

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
        where = f"{self.link.address} (leader epoch {self.link.fence.newest})"
        log.info("registered as %s incarnation %d at %s", node.node_name, node.incarnation, where)
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
        self.evictions.acknowledge_if_done(reports)
        wait = decisions.heartbeat_wait(running=bool(self.supervisor.running()))
        notice = self.state.notice
        try:
            building = self.supervisor.building()
            reply = await self.link.heartbeat(self.state.node, reports, notice, building, wait, self.state.risk)
        except UserInputError as exc:
            log.error("the controller's assignment is unusable: %s", exc)
            return False
        except CallRefused as exc:
            # Never an exit: the next node to take this job would be refused the same (a crash loop).
            self.state.withheld, line = refusals.after_refusal(exc.detail, reports, self.state.withheld)
            log.error("heartbeat refused (%s): %s", exc.code, line)
            self._stop_trainers_if_lease_lapsed()
            return False
        except ControllerUnreachable as exc:  # a standby or a deposed leader too: nothing of its reply is used
            log.warning("heartbeat failed (%s); trainers keep running", exc)
            self.state.healthy = False
            self.state.interval = decisions.backed_off_interval(
                self.state.interval, self.config.max_backoff_seconds, self.state.node.heartbeat_expiry
            )
            self._stop_alone_if_due()
            self._stop_trainers_if_lease_lapsed()
            return False
        except RegisterAgain as exc:
            log.warning("controller no longer knows this incarnation (%s); registering anew", exc)
            self.supervisor.kill_all()
            await self._register()
            return False
        self.state.last_contact = time.monotonic()
        self._told_running = any(r.status.running for r in reports)
        if notice is not None:
            self._heard(notice, "this heartbeat")
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

    def _heard(self, notice: EvictionNotice, how: str) -> None:
        """A controller answered a call carrying ``notice``: the notice is its to act on, and what the trainers did
        alone meanwhile is told (``how``: the call that told it)."""
        self.state.heard = notice.event_id
        alone = self.state.stopped_alone
        if alone is not None and alone.event_id == notice.event_id:
            log.warning(
                "controller %s answers again: %s told it of eviction notice %s, and its reports of how generation "
                "%d of %s stopped here on its own meanwhile (leaving)",
                self.link.address,
                how,
                notice.event_id,
                alone.generation,
                alone.job_id,
            )
            self.state.stopped_alone = None

    def _stop_alone_if_due(self) -> None:
        """An eviction notice no controller heard of within ``alone_after_seconds``: this node's trainers stop at
        the next step boundary, leaving, as the controller would have asked (they hand off or write the step)."""
        waited = time.monotonic() - self.state.noticed_at
        notice = self.state.notice
        if notice is None or not decisions.alone_due(
            notice, self.state.notice_heard(), waited, self.config.alone_after_seconds
        ):
            return
        statuses = [r.status for r in self.supervisor.reports()]
        stop = decisions.stop_alone(notice, self.state.desired, statuses)
        if stop is None:
            return
        log.warning(
            "no controller has heard of eviction notice %s for %.1f s: generation %d of %s stops here on its own, "
            "leaving (its ranks hand what only they hold to the ranks that stay, or write the step)",
            notice.event_id,
            waited,
            stop.generation,
            stop.job_id,
        )
        command = RequestStop(stop.job_id, stop.generation)
        perform(command, self.supervisor, self.config.gpus, self.config.slots, self.state.launch, leaving=True)
        self.state.stopped_alone = stop

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
        for command in converge(wanted, (r.status for r in self.supervisor.reports()), noticed=leaving):
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
        if isinstance(fact, EvictionNotice):
            self._heard(fact, "the notice's own report")
        if incoming is not None:
            self._apply(incoming)
