"""The controller process: settings, the grpc.aio server with health and reflection, timers, SIGTERM.

Settings come from flags, else ``SPOTMORPH_CONTROLLER_*`` environment variables, else a YAML config
file (``--config``), else defaults. Listening beyond loopback needs TLS (tokens must not cross a
network in clear text) unless ``allow_plaintext`` says otherwise.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from pathlib import Path
from typing import Any, Literal

import grpc
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer as AsyncHealthServicer
from grpc_reflection.v1alpha import reflection
from pydantic_settings import BaseSettings, SettingsConfigDict

from controller.api.agent import AgentService
from controller.api.auth import AuthInterceptor, Role, Tokens, read_or_create_token
from controller.api.cluster import ClusterService
from controller.api.jobs import JobsService
from controller.app.providers import close_provider, make_provider
from controller.core.reconcile import Config
from controller.observability.metrics import serve_metrics
from controller.persistence.store import Store
from controller.providers.azure_config import AzureSettings
from controller.providers.base import StaticProvider
from controller.shell.latency import Histogram
from controller.shell.runner import Clock, Runner, SystemClock
from controller.shell.views import StateView
from morphing.errors import UserInputError
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from scheduler.timers import TimerConfig, Timers

log = logging.getLogger("spotmorph.controller")
MAX_MESSAGE_BYTES = 1 << 20


class ControllerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTMORPH_CONTROLLER_", extra="forbid")

    state_dir: Path = Path("spotmorph-state")
    listen: str = "127.0.0.1:50051"
    token_file: Path | None = None  # operator token; default STATE_DIR/operator.token
    reader_token_file: Path | None = None
    agent_token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None  # with it, clients must present a certificate signed by this CA
    allow_plaintext: bool = False
    heartbeat_interval_seconds: float = 1.0
    heartbeat_expiry_seconds: float = 10.0
    debounce_seconds: float = 5.0
    stop_timeout_seconds: float = 120.0
    checkpoint_request_seconds: float = 0.0
    rendezvous_port_base: int = 29500
    morph_cost_seconds: float = 30.0  # expected price of a morph, weighed against growth
    metrics_listen: str | None = None  # HOST:PORT for Prometheus (GET /metrics); None: off
    provider: Literal["static", "local", "azure"] = "static"  # where VMs come from (docs/azure.md)
    azure: AzureSettings | None = None  # provider: azure


def load_settings(config_file: Path | None, overrides: dict[str, Any]) -> ControllerSettings:
    """Flags win over the environment, which wins over the config file."""
    base: dict[str, Any] = {}
    if config_file is not None:
        try:
            base = yaml.safe_load(config_file.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UserInputError(f"--config {config_file}: {exc}") from None
    env = ControllerSettings()
    from_env = {k: getattr(env, k) for k in env.model_fields_set}
    return ControllerSettings(**{**base, **from_env, **{k: v for k, v in overrides.items() if v is not None}})


def is_loopback(listen: str) -> bool:
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Controller:
    """A running controller; ``await start()``, then ``await stop()`` (also what SIGTERM does)."""

    def __init__(self, settings: ControllerSettings, clock: Clock | None = None) -> None:
        # APScheduler logs every run of every interval job at INFO ("Running job Runner.tick" each second).
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        self.settings = settings
        state = settings.state_dir
        state.mkdir(parents=True, exist_ok=True)
        static = {
            read_or_create_token(settings.token_file or state / "operator.token"): Role.OPERATOR,
            read_or_create_token(settings.reader_token_file or state / "reader.token"): Role.READER,
            read_or_create_token(settings.agent_token_file or state / "agent.token"): Role.AGENT,
        }
        self.tokens = Tokens(static, read_or_create_token(state / "node-secret").encode())
        self.store = Store(state / "state.db")
        config = Config(
            heartbeat_expiry_seconds=settings.heartbeat_expiry_seconds,
            debounce_seconds=settings.debounce_seconds,
            stop_timeout_seconds=settings.stop_timeout_seconds,
            rendezvous_port_base=settings.rendezvous_port_base,
            morph_cost_seconds=settings.morph_cost_seconds,
        )
        self.runner = Runner(self.store, clock or SystemClock(), config, StaticProvider())
        self.runner.provider, poll_seconds = make_provider(settings, self.runner, settings.listen)
        self.stopping = asyncio.Event()
        self.health = AsyncHealthServicer()
        checkpoints = settings.checkpoint_request_seconds
        timers = TimerConfig(checkpoint_request_seconds=checkpoints, provider_poll_seconds=poll_seconds)
        self.timers = Timers(timers)
        self.server = grpc.aio.server(
            interceptors=[AuthInterceptor(self.tokens)],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", 16 * MAX_MESSAGE_BYTES),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.so_reuseport", 0),
            ],
        )
        self.heartbeat_latency = Histogram()
        self.view = StateView(self.runner, self.heartbeat_latency)
        rpc.add_JobsServicer_to_server(JobsService(self.view, self.runner, self.stopping), self.server)
        self.metrics_server: Any = None
        self.metrics_port = 0
        rpc.add_ClusterServicer_to_server(ClusterService(self.view, self.store.schema_version()), self.server)
        interval = settings.heartbeat_interval_seconds
        agent = AgentService(self.view, self.runner, self.tokens, interval, self.heartbeat_latency)
        rpc.add_AgentServicer_to_server(agent, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [pb.DESCRIPTOR.services_by_name[s].full_name for s in ("Jobs", "Cluster", "Agent")]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.port = self._bind()

    def _bind(self) -> int:
        s = self.settings
        if s.tls_cert and s.tls_key:
            root = s.tls_ca.read_bytes() if s.tls_ca else None
            credentials = grpc.ssl_server_credentials(
                [(s.tls_key.read_bytes(), s.tls_cert.read_bytes())],
                root_certificates=root,
                require_client_auth=root is not None,
            )
            port = self.server.add_secure_port(s.listen, credentials)
        elif is_loopback(s.listen) or s.allow_plaintext:
            port = self.server.add_insecure_port(s.listen)
        else:
            raise UserInputError(
                f"--listen {s.listen}: beyond loopback the controller needs TLS (--tls-cert/--tls-key, "
                "see `spotmorph certs`), or --allow-plaintext on a network you trust"
            )
        if port == 0:
            raise UserInputError(f"--listen {s.listen}: cannot bind (in use?)")
        return port

    async def start(self) -> None:
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        runner = self.runner
        self.timers.start(
            expiry=runner.tick, debounce=runner.tick, checkpoints=runner.request_checkpoints, poll=runner.poll_provider
        )
        await runner.tick()
        host = self.settings.listen.rsplit(":", 1)[0]
        (self.settings.state_dir / "controller.addr").write_text(f"{host}:{self.port}\n")
        if self.settings.metrics_listen:
            self.metrics_server, self.metrics_port = await serve_metrics(self.settings.metrics_listen, self.view)
            metrics_host = self.settings.metrics_listen.rsplit(":", 1)[0]
            (self.settings.state_dir / "metrics.addr").write_text(f"{metrics_host}:{self.metrics_port}\n")
        log.info("controller listening on %s:%d (state in %s)", host, self.port, self.settings.state_dir)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight calls finish, persist the last decisions, close the store."""
        self.stopping.set()
        await self.health.enter_graceful_shutdown()
        self.timers.stop()
        await self.server.stop(grace)
        async with self.runner.lock:
            self.runner._reconcile()
        await close_provider(self.runner.provider)
        if self.metrics_server is not None:
            await self.metrics_server.cleanup()
        self.view.close()
        self.store.close()


async def serve(settings: ControllerSettings) -> int:
    controller = Controller(settings)
    await controller.start()
    print(f"spotmorph controller listening on {settings.listen.rsplit(':', 1)[0]}:{controller.port}", flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    await controller.stop()
    return 0
