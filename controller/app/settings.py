"""The controller's settings: every knob named and documented here (docs/controller.md lists them).

Settings come from flags, else ``SPOTMORPH_CONTROLLER_*`` environment variables, else a YAML config
file (``--config``), else defaults. Each field's docstring is its description (``use_attribute_docstrings``),
so the JSON Schema and the docs test read the same words.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from controller.files import CONFIG_LIMIT, read_small_text
from controller.hosts import is_loopback_host
from controller.providers.aws_config import AwsSettings
from controller.providers.azure_config import AzureSettings
from controller.providers.gcp_config import GcpSettings
from morphing.errors import UserInputError

HOST_NAME = r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"

MIB = 1 << 20
ENV_PREFIX = "SPOTMORPH_CONTROLLER_"
# Settings renamed (issue 46: "hold" means training state kept in memory, so a flapping node's wait is a
# quarantine): read under their old names in this release only, with a warning; the next release refuses them.
RENAMED_SETTINGS: dict[str, str] = {
    "rejoin_hold_seconds": "rejoin_quarantine_seconds",
    "rejoin_hold_max_seconds": "rejoin_quarantine_max_seconds",
}

log = logging.getLogger(__name__)


class LocalSettings(BaseModel):
    """The ``local:`` section: agents started as processes on this machine (``provider: local``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    poll_seconds: float = Field(default=2.0, gt=0)
    """How often the controller lists its agent processes (a dead one makes its node GONE)."""
    slots: int = Field(default=1, ge=1)
    """CPU slots of each agent the controller starts."""
    max_nodes: int = Field(default=4, ge=0)
    """Queued jobs make the controller start agents up to this many alive ones (0: never start any)."""
    imds_url: str | None = None
    """Scheduled Events endpoint the started agents watch for eviction notices (None: none)."""
    max_on_demand_nodes: int | None = Field(default=None, ge=0)
    """On-demand agents (never evicted by the cloud) the controller starts for deadlines, at most (None: max_nodes)."""


class SchedulerSettings(BaseModel):
    """The ``scheduler:`` section: the deadline rule's times (``scheduler.deadlines.DeadlineConfig``) and how GPUs
    are shared among jobs (``scheduler.allocation.ShareConfig``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    safety_seconds: float = Field(default=900.0, ge=0, le=86_400 * 7, allow_inf_nan=False)
    """The last safe moment keeps this margin before a deadline (its work on all its on-demand GPUs, a morph and a
    VM's start before that)."""
    on_demand_start_seconds: float = Field(default=120.0, ge=0, le=86_400, allow_inf_nan=False)
    """A requested on-demand VM's expected time to arrive."""
    outlook_step_seconds: float = Field(default=600.0, gt=0, le=86_400, allow_inf_nan=False)
    """The cluster's projection to each deadline advances in steps of this."""
    aging_seconds: float = Field(default=3600.0, gt=0, le=86_400 * 30, allow_inf_nan=False)
    """A job waiting with no GPUs gains a priority level every this many seconds it waits."""
    starvation_seconds: float = Field(default=7200.0, gt=0, le=86_400 * 30, allow_inf_nan=False)
    """A job that waited this long is served first, stopping the lowest-priority jobs that ran min_run_seconds."""
    min_run_seconds: float = Field(default=3600.0, ge=0, le=86_400 * 30, allow_inf_nan=False)
    """A job runs at least this long before a higher-priority or starving job may stop it (a shrink: any time)."""
    horizon_seconds: float = Field(default=1800.0, gt=0, le=86_400 * 7, allow_inf_nan=False)
    """Moving GPUs between running jobs must pay both morphs within this."""


class ControllerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", use_attribute_docstrings=True)

    state_dir: Path = Path("spotmorph-state")
    """SQLite state, tokens and ``controller.lock``; one controller per directory."""
    listen: str = "127.0.0.1:50051"
    """HOST:PORT of the gRPC API (port 0: any free one, written to STATE_DIR/controller.addr)."""
    database: str | None = Field(default=None, max_length=2048)
    """``postgresql://USER@HOST:PORT/DB``: state in PostgreSQL, shared by every controller given the same URL
    (one leads under a lease, the others stand by); None: the SQLite file in ``state_dir``."""
    advertise: str | None = Field(default=None, max_length=260)
    """HOST:PORT agents and clients reach this controller at, named to them by standbys (default: ``listen``;
    give it when listening on every interface)."""
    lease_seconds: float = Field(default=6.0, ge=1.0, le=300.0)
    """The leader's lease: renewed every third of it; a standby takes over once it ran out (PostgreSQL only)."""
    standby_poll_seconds: float = Field(default=1.0, gt=0, le=60.0)
    """How often a standby looks whether the lease ran out, and reloads what it answers reads from."""
    token_file: Path | None = None
    """Operator token (default STATE_DIR/operator.token, random when missing)."""
    reader_token_file: Path | None = None
    """Read-only token (default STATE_DIR/reader.token)."""
    agent_token_file: Path | None = None
    """The shared agent token, read only with ``shared_agent_token`` (default STATE_DIR/agent.token)."""
    shared_agent_token: bool = False
    """Also let agents register with one token shared by all (weaker: instance ids are then only claimed)."""
    tls_cert: Path | None = None
    """Server certificate (PEM); with ``tls_key``, the API speaks TLS."""
    tls_key: Path | None = None
    """Server key (PEM)."""
    tls_ca: Path | None = None
    """With it, clients must present a certificate signed by this CA (mutual TLS)."""
    allow_plaintext: bool = False
    """Listen beyond loopback without TLS (only on a network you trust)."""
    heartbeat_interval_seconds: float = 1.0
    """How often agents are told to send heartbeats."""
    heartbeat_expiry_seconds: float = 10.0
    """A node silent for this long is LOST."""
    rejoin_quarantine_seconds: float = Field(default=10.0, ge=0)
    """A node back soon after it was LOST is quarantined in JOINING this long before it gets work (0: at once)."""
    rejoin_quarantine_max_seconds: float = Field(default=300.0, ge=0)
    """The quarantine doubles with each further flap within the memory, up to this."""
    flap_memory_seconds: float = Field(default=600.0, ge=0)
    """How long a LOST counts: a node back later is not quarantined, and its flaps are forgotten."""
    gone_retention_seconds: float = Field(default=3600.0, ge=0)
    """A GONE node's record is deleted after this (at least ``flap_memory_seconds``); its events stay."""
    debounce_seconds: float = 5.0
    """Wait this long after node arrivals before admitting or growing jobs onto them."""
    stop_timeout_seconds: float = 120.0
    """A planned morph's STOP not done by then becomes ABORT."""
    suspect_grace_seconds: float = Field(default=1.5, gt=0)
    """After a survivor's collective failed: nodes of its generation silent this long are taken for lost."""
    salvage_write_seconds: float = Field(default=30.0, gt=0)
    """A just-in-time checkpoint of an unplanned loss not committed by then is given up (periodic fallback)."""
    progress_event_seconds: float = Field(default=60.0, gt=0, le=86_400)
    """A running job's loss and samples/s go to the event log (TrainingProgressed) at most this often."""
    checkpoint_request_seconds: float = 0.0
    """Ask running jobs for a checkpoint this often (0: off; trainers checkpoint every N steps anyway)."""
    rendezvous_port_base: int = 29500
    """First port of the rank-0 trainers' rendezvous range."""
    morph_cost_seconds: float = 30.0
    """Expected price of a morph, weighed against the throughput growth would bring."""
    warm_build_wait_seconds: float = Field(default=60.0, ge=0, le=86_400)
    """A growth onto a free node whose warm trainer is still building the job's model ahead waits for the build,
    at most this long after the node joined (0: never waits; the new rank then builds inside the pause)."""
    max_log_followers: int = Field(default=256, ge=1, le=100_000)
    """WatchLogs --follow streams the controller serves at once; more are RESOURCE_EXHAUSTED."""
    max_log_followers_per_caller: int = Field(default=32, ge=1, le=100_000)
    """WatchLogs --follow streams one token may hold at once; more are RESOURCE_EXHAUSTED."""
    metrics_listen: str | None = None
    """HOST:PORT for Prometheus (GET /metrics; HTTPS with the API's certificate when TLS is on) and, on loopback or
    with TLS, the web dashboard (GET /); None: off."""
    tensorboard_dir: Path | None = None
    """Write TensorBoard event files here, a folder per job (loss, eval loss, samples/s, layout, morphs); None: off."""
    metrics_allow_remote: bool = False
    """Serve metrics beyond loopback in plain HTTP, without TLS (only on a network you trust)."""
    metrics_allowed_hosts: list[Annotated[str, Field(pattern=HOST_NAME, max_length=253)]] = Field(
        default_factory=list, max_length=64
    )
    """Names (beyond this machine's, localhost and any IP address) a request to the metrics port may give in its
    Host header, e.g. a DNS name Prometheus scrapes it by; others are answered 421 (DNS rebinding)."""
    provider: Literal["static", "local", "azure", "aws", "gcp"] = "static"
    """Where VMs come from (static: only through their agents; azure: docs/azure.md; aws: docs/aws.md; gcp:
    docs/gcp.md)."""
    azure: AzureSettings | None = None
    """The ``azure:`` section, for ``provider: azure``."""
    aws: AwsSettings | None = None
    """The ``aws:`` section, for ``provider: aws``."""
    gcp: GcpSettings | None = None
    """The ``gcp:`` section, for ``provider: gcp``."""
    local: LocalSettings = Field(default_factory=LocalSettings)
    """The ``local:`` section, for ``provider: local``."""
    on_demand_gpu_hour_price: float = Field(default=3.0, gt=0, le=1_000_000, allow_inf_nan=False)
    """Dollars an on-demand GPU costs per hour: turns a job's ``on_demand_max_dollars`` into GPUs, and what status
    says its on-demand nodes cost so far."""
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    """The ``scheduler:`` section: when a deadline asks for on-demand capacity."""
    capacity_retry_seconds: float = Field(default=30.0, gt=0)
    """A capacity request the provider refused is asked again after this (a changed level at once)."""
    reconcile_coalesce_seconds: float = Field(default=0.005, ge=0)
    """The first of a burst of state changes waits this long so one reconcile decides them all."""
    validate_invariants: bool = False
    """Check every decided world against controller.core.invariants before it is committed (a bug's canary)."""
    shutdown_grace_seconds: float = Field(default=5.0, ge=0)
    """On SIGTERM, in-flight calls get this long to finish."""
    max_receive_message_bytes: int = Field(default=MIB, ge=1024)
    """Larger requests get RESOURCE_EXHAUSTED."""
    max_send_message_bytes: int = Field(default=16 * MIB, ge=1024)
    """Largest reply (a cluster state of ~1,000 nodes fits)."""
    keepalive_time_seconds: float = Field(default=30.0, gt=0)
    """Ping idle client connections this often, so that dead ones are noticed and closed."""
    keepalive_timeout_seconds: float = Field(default=10.0, gt=0)
    """A connection whose ping is not answered within this is closed."""
    min_client_ping_seconds: float = Field(default=5.0, gt=0)
    """Clients pinging more often than this (without calls) are told to go away."""


def load_settings(config_file: Path | None, overrides: dict[str, Any]) -> ControllerSettings:
    """Flags win over the environment, which wins over the config file."""
    base: dict[str, Any] = {}
    if config_file is not None:
        try:
            base = yaml.safe_load(read_small_text(config_file, "--config", CONFIG_LIMIT)) or {}
        except yaml.YAMLError as exc:
            raise UserInputError(f"--config {config_file}: {exc}") from None
        if isinstance(base, dict):
            base = renamed_settings(base, f"--config {config_file}", str)
    try:
        env = ControllerSettings()
        from_env = {**_old_environment(), **{k: getattr(env, k) for k in env.model_fields_set}}
        from_env = renamed_settings(from_env, "environment", env_name)
        return ControllerSettings(**{**base, **from_env, **{k: v for k, v in overrides.items() if v is not None}})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise UserInputError(f"invalid settings: {problems} (see docs/controller.md, Settings)") from None


def env_name(setting: str) -> str:
    """The environment variable that gives ``setting``."""
    return f"{ENV_PREFIX}{setting.upper()}"


def _old_environment() -> dict[str, str]:
    """The renamed settings the environment gives under their old names (matched as pydantic-settings matches
    its own: regardless of case), which the settings model no longer reads."""
    names = {env_name(old): old for old in RENAMED_SETTINGS}
    return {names[name.upper()]: value for name, value in os.environ.items() if name.upper() in names}


def renamed_settings(values: dict[str, Any], where: str, spelled: Callable[[str], str]) -> dict[str, Any]:
    """``values`` (of one source: ``where``, its names as ``spelled``) with each renamed setting under its new
    name, and a warning in the log for each old name found; where both names are given, the new one wins."""
    out = dict(values)
    for old, new in RENAMED_SETTINGS.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in out:
            log.warning(
                "%s: %s is ignored: %s is given too (remove the deprecated name)", where, spelled(old), spelled(new)
            )
        else:
            log.warning(
                "%s: %s is deprecated: rename it %s (read as that in this release; the next release refuses it)",
                where,
                spelled(old),
                spelled(new),
            )
            out[new] = value
    return out


def check_exposure(s: ControllerSettings, tls: bool) -> None:
    """Beyond loopback the API needs TLS (tokens cross the network), and metrics TLS or an explicit yes."""
    if not (tls or is_loopback(s.listen) or s.allow_plaintext):
        raise UserInputError(
            f"--listen {s.listen}: beyond loopback the controller needs TLS (--tls-cert/--tls-key, "
            "see `spotmorph certs`), or --allow-plaintext on a network you trust"
        )
    if s.metrics_listen and not (tls or is_loopback(s.metrics_listen) or s.metrics_allow_remote):
        raise UserInputError(
            f"--metrics-listen {s.metrics_listen}: beyond loopback metrics need TLS (--tls-cert/--tls-key: they "
            "are served over HTTPS), or --metrics-allow-remote for plain HTTP on a network you trust; "
            "or listen on 127.0.0.1"
        )


def is_loopback(listen: str) -> bool:
    """Whether HOST of HOST:PORT is this machine only (an empty host means every interface)."""
    return is_loopback_host(listen.rsplit(":", 1)[0].strip("[]"))
