"""The controller process: the grpc.aio server with health and reflection, timers, SIGTERM.

Listening beyond loopback needs TLS (tokens must not cross a network in clear text) unless
``allow_plaintext`` says otherwise; metrics likewise, unless ``metrics_allow_remote``. Wiring order:
check the settings and the TLS files (a bad one leaves no trace), lock the state directory, open the
store, bind (the provider needs the real address for the agents it starts), build the provider on its
port, then the runner with that provider, then the servicers on the runner.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AsyncHealthServicer
from grpc_reflection.v1alpha import reflection

from controller.api.agent import AgentService
from controller.api.auth import AuthInterceptor, Role, Tokens, read_or_create_token, token_secret
from controller.api.cluster import ClusterService
from controller.api.followers import Followers
from controller.api.identity import IdentityService
from controller.api.jobs import JobsService
from controller.api.leader_gate import LeaderGate
from controller.app.leadership import Leadership, LeaseTiming
from controller.app.providers import ProviderFactory, make_provider
from controller.app.settings import ControllerSettings, SchedulerSettings, check_exposure, is_loopback
from controller.app.shared_secrets import share_secrets
from controller.app.state_lock import lock_state_dir
from controller.app.timers import CHECKPOINT_REQUESTS, DEBOUNCE, HEARTBEAT_EXPIRY, TimerConfig, Timers
from controller.app.tls import load_server_tls
from controller.core.flapping import Damping
from controller.core.leadership import ControllerRole, RoleCause, RoleChange
from controller.core.reconcile import Config
from controller.core.stimulus import START, Stimulus
from controller.eventlog import facts
from controller.files import private_file, set_mode, write_public
from controller.observability.curves import LossCurves
from controller.observability.metrics import serve_metrics
from controller.observability.tensorboard import TensorBoardExport
from controller.persistence.store import Store
from controller.providers.base import Clock, ProviderInbox
from controller.providers.identity import IdentityVerifier
from controller.shell.latency import Histogram
from controller.shell.logbook import LogBook
from controller.shell.runner import Runner, RunnerSettings, SystemClock
from controller.shell.views import StateView
from morphing.errors import UserInputError
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from scheduler.policy import SchedulerConfig

log = logging.getLogger("spotmorph.controller")


def grpc_options(s: ControllerSettings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", s.max_receive_message_bytes),
        ("grpc.max_send_message_length", s.max_send_message_bytes),
        ("grpc.keepalive_time_ms", round(s.keepalive_time_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", round(s.keepalive_timeout_seconds * 1000)),
        ("grpc.http2.min_ping_interval_without_data_ms", round(s.min_client_ping_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.so_reuseport", 0),  # a second controller on the same port must fail to bind, not share it
    ]


def reconcile_config(s: ControllerSettings) -> Config:
    return Config(
        heartbeat_expiry_seconds=s.heartbeat_expiry_seconds,
        gone_retention_seconds=s.gone_retention_seconds,
        debounce_seconds=s.debounce_seconds,
        stop_timeout_seconds=s.stop_timeout_seconds,
        suspect_grace_seconds=s.suspect_grace_seconds,
        salvage_write_seconds=s.salvage_write_seconds,
        progress_event_seconds=s.progress_event_seconds,
        rendezvous_port_base=s.rendezvous_port_base,
        morph_cost_seconds=s.morph_cost_seconds,
        warm_build_wait_seconds=s.warm_build_wait_seconds,
        damping=Damping(s.rejoin_quarantine_seconds, s.rejoin_quarantine_max_seconds, s.flap_memory_seconds),
        on_demand_gpu_hour_price=s.on_demand_gpu_hour_price,
        scheduler=scheduler_config(s.scheduler),
    )


def scheduler_config(s: SchedulerSettings) -> SchedulerConfig:
    """The scheduler's defaults with the times the ``scheduler:`` section gives."""
    base = SchedulerConfig()
    share = replace(
        base.share,
        aging_seconds=s.aging_seconds,
        starvation_seconds=s.starvation_seconds,
        min_run_seconds=s.min_run_seconds,
        horizon_seconds=s.horizon_seconds,
    )
    timing = replace(
        base.deadlines,
        safety_seconds=s.safety_seconds,
        on_demand_start_seconds=s.on_demand_start_seconds,
        outlook_step_seconds=s.outlook_step_seconds,
    )
    return replace(base, deadlines=timing, share=share)


def private_database(path: Path) -> Path:
    """``path`` made 0600 before SQLite opens it: SQLite gives its -wal and -shm files the database's mode."""
    private_file(path)
    for companion in (path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")):
        if companion.exists():
            set_mode(companion, 0o600)
    return path


class Controller:
    """A running controller; ``await start()``, then ``await stop()`` (also what SIGTERM does)."""

    def __init__(
        self,
        settings: ControllerSettings,
        clock: Clock | None = None,
        providers: Mapping[str, ProviderFactory] | None = None,
    ) -> None:
        # APScheduler logs every run of every interval job at INFO ("Running job Runner.tick" each second).
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        self.settings = settings
        self.tls = load_server_tls(settings)
        check_exposure(settings, tls=self.tls is not None)
        self.metrics_tls = self.tls.ssl_context() if self.tls and settings.metrics_listen else None
        self.providers = providers  # factories of providers the controller does not hold (``local``)
        self.state_lock = lock_state_dir(settings.state_dir)
        try:
            self._build(clock or SystemClock())
        except BaseException:
            self.state_lock.release()
            raise

    def _build(self, clock: Clock) -> None:
        settings = self.settings
        state = settings.state_dir
        files = [
            (settings.token_file or state / "operator.token", "--token-file", Role.OPERATOR),
            (settings.reader_token_file or state / "reader.token", "reader_token_file", Role.READER),
        ]
        if settings.shared_agent_token:  # off by default: agents then prove their VM with a token of its own
            files.append((settings.agent_token_file or state / "agent.token", "agent_token_file", Role.AGENT))
        static = {read_or_create_token(path, flag): role for path, flag, role in files}  # a bad file: no store yet
        secret = token_secret(state)
        self.store = Store(settings.database) if settings.database else Store(private_database(state / "state.db"))
        if self.store.shared:  # every controller of the database authenticates every token
            share_secrets(self.store, state, [(path, flag, f"{role}-token") for path, flag, role in files])
            static = {read_or_create_token(path, flag): role for path, flag, role in files}
            secret = token_secret(state)
        self.tokens = Tokens(static, secret)
        timing = LeaseTiming(settings.lease_seconds, settings.standby_poll_seconds)
        self.leadership = Leadership(self.store, "", timing, clock, self._role_changed)
        interceptors = [AuthInterceptor(self.tokens), LeaderGate(self.leadership)]
        self.server = grpc.aio.server(interceptors=interceptors, options=grpc_options(settings))
        self.port = self._bind()
        host = settings.listen.rsplit(":", 1)[0]
        self.leadership.address = settings.advertise or f"{host}:{self.port}"
        self.inbox = ProviderInbox(clock)
        provider, poll_seconds = make_provider(settings, self.inbox, clock, f"{host}:{self.port}", self.providers)
        tuning = RunnerSettings(
            settings.reconcile_coalesce_seconds, settings.capacity_retry_seconds, settings.validate_invariants
        )
        self.stopping = asyncio.Event()
        self.health = AsyncHealthServicer()
        self._health_updates: set[asyncio.Task[None]] = set()
        config = replace(reconcile_config(settings), rendezvous_salt=self.tokens.rendezvous_salt())
        self.runner = Runner(self.store, clock, config, provider, self.inbox, tuning, self._decisions_work)
        self.runner.deposed = self._deposed
        checkpoints = settings.checkpoint_request_seconds
        self.timer_config = TimerConfig(checkpoint_request_seconds=checkpoints, provider_poll_seconds=poll_seconds)
        self.timers = Timers(self.timer_config)
        self._following: asyncio.Task[None] | None = None  # a standby's reloads
        self.heartbeat_latency = Histogram()
        self.view = StateView(self.runner, self.heartbeat_latency, role=self._role)
        self.logbook = LogBook(self.store)  # trainers' logs: written and read off the event loop, not decisions
        self.followers = Followers(self.settings.max_log_followers_per_caller, self.settings.max_log_followers)
        jobs = JobsService(self.view, self.runner, self.stopping, logbook=self.logbook, followers=self.followers)
        rpc.add_JobsServicer_to_server(jobs, self.server)
        self.metrics_server: Any = None
        self.metrics_port = 0
        self._curves_task: asyncio.Task[None] | None = None  # the dashboard's loss curves (observability.curves)
        self.tensorboard: TensorBoardExport | None = None
        self._tensorboard_task: asyncio.Task[None] | None = None
        cluster = ClusterService(self.view, self.store.schema_version(), self.leadership)
        rpc.add_ClusterServicer_to_server(cluster, self.server)
        interval = settings.heartbeat_interval_seconds
        agent = AgentService(
            self.view,
            self.runner,
            self.tokens,
            interval,
            self.heartbeat_latency,
            logbook=self.logbook,
            leadership=self.leadership,
            on_registered=lambda: self.timers.poll_soon(),  # the timers of the current leadership, not these
        )
        rpc.add_AgentServicer_to_server(agent, self.server)
        verifier = provider if isinstance(provider, IdentityVerifier) else None  # GCP: signed identity tokens
        rpc.add_IdentityServicer_to_server(IdentityService(self.tokens, verifier), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [pb.DESCRIPTOR.services_by_name[s].full_name for s in ("Jobs", "Cluster", "Agent", "Identity")]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)

    def _role(self) -> tuple[bool, int]:
        return self.leadership.leading, self.leadership.epoch

    def _decisions_work(self, ok: bool) -> None:
        """The runner's health port: while decisions fail, the health service says NOT_SERVING."""
        if self.stopping.is_set():
            return
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        task = asyncio.ensure_future(self.health.set("", status))
        self._health_updates.add(task)
        task.add_done_callback(self._health_updates.discard)

    def _bind(self) -> int:
        s = self.settings
        if self.tls is not None:
            port = self.server.add_secure_port(s.listen, self.tls.grpc_credentials())
        else:  # check_exposure allowed plaintext here
            port = self.server.add_insecure_port(s.listen)
        if port == 0:
            raise UserInputError(f"--listen {s.listen}: cannot bind (in use?)")
        return port

    async def _role_changed(self, change: RoleChange) -> None:
        """Leading: decide from what the database holds, with the timers on. Standing by: timers off, reload
        what reads are answered from, every poll."""
        if change.target is ControllerRole.LEADING:
            await self._stop_following()
            async with self.runner.lock:
                self.runner.reload()  # every node gets a heartbeat expiry from now to find this controller
                self.runner.capacity_ask = None
            self._start_timers()
            elected = facts.LeaderElected(change.epoch, self.leadership.address, self.leadership.previous)
            await self.runner.decide(lambda _world, now: [elected.recorded(now)], Stimulus.tick(START))
        elif change.target is ControllerRole.STANDBY:
            self.timers.stop()
            self._following = asyncio.ensure_future(self._follow())
            self._following.add_done_callback(_log_if_failed)

    def _start_timers(self) -> None:
        runner = self.runner
        self.timers.stop()
        self.timers = Timers(self.timer_config)
        # Each decision a timer triggers records the timer (controller.core.stimulus). Partials, not lambdas:
        # APScheduler awaits what it recognises as a coroutine function, and a lambda's coroutine never runs.
        self.timers.start(
            expiry=functools.partial(runner.tick, HEARTBEAT_EXPIRY),
            debounce=functools.partial(runner.tick, DEBOUNCE),
            checkpoints=functools.partial(runner.request_checkpoints, CHECKPOINT_REQUESTS),
            poll=runner.poll_provider,
        )

    async def _follow(self) -> None:
        while True:
            try:
                await self.runner.refresh()
            except Exception as exc:  # the database is down: answer from the last reload meanwhile
                log.warning("standby could not reload the state: %s", exc)
            await asyncio.sleep(self.settings.standby_poll_seconds)

    async def _stop_following(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
            self._following = None

    def _deposed(self) -> None:
        """A write found another controller's epoch: step down now (not at the next renewal)."""
        task = asyncio.ensure_future(self.leadership.step_down(RoleCause.DEPOSED))
        self._health_updates.add(task)
        task.add_done_callback(self._health_updates.discard)

    async def start(self) -> None:
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.leadership.start()  # leading: the first decision is made before controller.addr says "ready"
        write_public(self.settings.state_dir / "controller.addr", f"{self.leadership.address}\n".encode())
        host = self.settings.listen.rsplit(":", 1)[0]
        if self.settings.metrics_listen:
            listen = self.settings.metrics_listen
            # The dashboard's data needs a token: served over TLS, or on loopback (no token crosses a network).
            dashboard = (self.tokens, LossCurves()) if self.metrics_tls is not None or is_loopback(listen) else None
            self.metrics_server, self.metrics_port = await serve_metrics(
                listen, self.view, self.metrics_tls, dashboard, self.settings.metrics_allowed_hosts
            )
            if dashboard is not None:
                self._curves_task = asyncio.ensure_future(dashboard[1].run(self.view))
                self._curves_task.add_done_callback(_log_if_failed)
            metrics_host = self.settings.metrics_listen.rsplit(":", 1)[0]
            write_public(self.settings.state_dir / "metrics.addr", f"{metrics_host}:{self.metrics_port}\n".encode())
        if self.settings.tensorboard_dir is not None:
            self.tensorboard = TensorBoardExport(self.settings.tensorboard_dir, self.view, self.runner.clock.now)
            self._tensorboard_task = asyncio.ensure_future(self.tensorboard.run())
        log.info("controller listening on %s:%d (state in %s)", host, self.port, self.settings.state_dir)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, let in-flight calls finish, persist the last decisions, close, unlock the directory."""
        self.stopping.set()
        await self.health.enter_graceful_shutdown()
        self.timers.stop()
        await self.server.stop(self.settings.shutdown_grace_seconds if grace is None else grace)
        await self._stop_following()
        await self.runner.close(decide=self.leadership.leading)
        await self.leadership.stop()  # a leader's lease released: a standby takes over at its next look
        if self.metrics_server is not None:
            await self.metrics_server.cleanup()
        if self._curves_task is not None:
            self._curves_task.cancel()
            await asyncio.gather(self._curves_task, return_exceptions=True)
        if self._tensorboard_task is not None and self.tensorboard is not None:
            self._tensorboard_task.cancel()
            await asyncio.gather(self._tensorboard_task, return_exceptions=True)
            try:
                self.tensorboard.export(self.view.jobs())  # the last decisions' points
                self.tensorboard.close()
            except OSError as exc:  # a full disk must not keep the state directory locked
                log.warning("tensorboard export to %s failed at stop: %s", self.settings.tensorboard_dir, exc)
        self.view.close()
        self.logbook.close()
        self.store.close()
        self.state_lock.release()


async def serve(settings: ControllerSettings, providers: Mapping[str, ProviderFactory] | None = None) -> int:
    controller = Controller(settings, providers=providers)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before start writes controller.addr: from then on, a clean stop
        loop.add_signal_handler(sig, done.set)
    await controller.start()
    print(f"spotmorph controller listening on {settings.listen.rsplit(':', 1)[0]}:{controller.port}", flush=True)
    await done.wait()
    await controller.stop()
    return 0


def _log_if_failed(task: asyncio.Task[None]) -> None:
    """A background task of the controller's that ended by an error says so (its work stopped)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed; the dashboard's loss curves stop here", task, exc_info=task.exception())
