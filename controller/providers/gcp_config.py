"""Settings of the GCP Spot VM provider (the ``gcp:`` section of the controller's config; docs/gcp.md).

Kept apart from :mod:`controller.providers.gcp` so that reading and checking a config never imports the
Google Cloud client. Each field's docstring is its description (docs/gcp.md lists them all).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controller.hosts import is_loopback_host

# GCP: project ids are 6-30 lowercase letters, digits and hyphens, starting with a letter, not ending in a
# hyphen (older ones may hold a domain: "example.com:my-project"); zones look like us-central1-a; resource
# names (groups, instances) are RFC 1035 labels of at most 63 characters.
_PROJECT = re.compile(r"^([a-z][-a-z0-9.]{0,61}:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
GOOGLE_CERTS = "https://www.googleapis.com/oauth2/v3/certs"  # the keys that sign instance identity tokens


def check_url(value: str, what: str) -> str:
    """An https:// URL, or http:// to this machine only (a local fake in tests); the value without a final '/'."""
    parts = urlsplit(value)
    if parts.scheme == "https" and parts.hostname:
        return value.rstrip("/")
    if parts.scheme == "http" and parts.hostname and is_loopback_host(parts.hostname):
        return value.rstrip("/")
    raise ValueError(f"{value!r}: {what} is reached over https:// (http:// only on loopback, for a local fake)")


class GcpSettings(BaseModel):
    """The ``gcp:`` section: one zonal managed instance group of Spot VMs (``provider: gcp``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    project: str
    """The project id of the instance group (``gcloud config get project``)."""
    zone: str
    """The zone of the (zonal) managed instance group, e.g. ``us-central1-a``."""
    instance_group: str
    """The managed instance group's name (deploy/gcp/instance-group.json); its instance names are node names."""
    target_capacity: int = Field(ge=0, le=1000)
    """VMs the provider keeps in the group (its floor)."""
    max_capacity: int | None = Field(default=None, ge=0, le=1000)
    """Ceiling when the controller asks for more (busy nodes plus queued jobs); None: ``target_capacity``."""
    slots_per_instance: int = Field(default=1, ge=1, le=64)
    """GPUs per VM (the agents' slots): capacity asked for in GPUs becomes VMs by this."""
    poll_seconds: float = Field(default=15.0, gt=0)
    """How often the controller lists the group (a VM missing or stopped makes its node GONE)."""
    delete_busy_nodes: bool = False
    """Operator override: delete instances whose node runs a job (scale-in, release). Off: never."""
    backoff_seconds: float = Field(default=30.0, gt=0)
    """Wait after a capacity or quota error before changing the group again; doubles up to the max."""
    max_backoff_seconds: float = Field(default=900.0, gt=0)
    """The longest capacity backoff."""
    retries: int = Field(default=3, ge=0, le=10)
    """Retries of a throttled (429, 403 rateLimitExceeded) or unreachable call before it counts as failed."""
    retry_seconds: float = Field(default=1.0, ge=0, le=60)
    """The first wait before such a retry (Retry-After when the API gives one); doubles with each retry."""
    request_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    """Deadline of one API request (the client is synchronous: it runs in a thread of the provider's own)."""
    operation_poll_seconds: float = Field(default=2.0, ge=0, le=60)
    """How often a zone operation (resize, deleteInstances) is looked at until it is DONE."""
    operation_timeout_seconds: float = Field(default=600.0, gt=0)
    """An operation not DONE by then is given up (the next poll looks at the group again)."""
    api_endpoint: str | None = None
    """The Compute Engine API's address (None: the client's own, https://compute.googleapis.com); tests point it
    at a local fake over http://127.0.0.1 with anonymous credentials."""
    agent_tokens: bool = True
    """Hand each VM its own agent token for its signed instance identity token (Identity.ExchangeIdentity);
    off: the VMs share ``shared_agent_token``'s token and only claim their names."""
    identity_audience: str | None = Field(default=None, max_length=256)
    """The audience the VMs ask their identity tokens for (default ``spotmorph/PROJECT/ZONE/GROUP``)."""
    identity_certs: str = GOOGLE_CERTS
    """Where the keys that sign identity tokens come from: an https:// URL or a file (JWKS, or a JSON map of key
    id to PEM certificate, as Google serves both); default Google's JWKS."""
    identity_certs_refresh_seconds: float = Field(default=3600.0, ge=60)
    """How long fetched keys are used before they are fetched again (a token naming an unknown key refetches
    them at once, at most once a minute)."""

    on_demand_instance_group: str | None = None
    """A second managed instance group in the zone, of standard (not Spot) VMs, for on-demand capacity
    (deploy/gcp/); None: none, and a request for on-demand capacity is refused."""
    on_demand_max_capacity: int | None = Field(default=None, ge=0, le=1000)
    """The on-demand group's ceiling in VMs (its floor is 0); None: ``max_capacity`` (or ``target_capacity``)."""

    @model_validator(mode="after")
    def _capacity_range(self) -> GcpSettings:
        if self.max_capacity is not None and self.max_capacity < self.target_capacity:
            raise ValueError(f"max_capacity {self.max_capacity} < target_capacity {self.target_capacity}")
        if self.on_demand_instance_group == self.instance_group:
            raise ValueError(
                f"on_demand_instance_group {self.instance_group!r} is the Spot group: name a second group whose "
                "instance template has no Spot scheduling (deploy/gcp/)"
            )
        return self

    def on_demand(self) -> GcpSettings | None:
        """The settings of the on-demand group's provider: its name, floor 0, its ceiling; None: no such group."""
        if self.on_demand_instance_group is None:
            return None
        ceiling = self.on_demand_max_capacity if self.on_demand_max_capacity is not None else self.max_capacity
        update = {"instance_group": self.on_demand_instance_group, "on_demand_instance_group": None}
        return self.model_copy(
            update={
                **update,
                "target_capacity": 0,
                "max_capacity": ceiling if ceiling is not None else self.target_capacity,
            }
        )

    @property
    def audience(self) -> str:
        """The audience identity tokens must name: this controller's instance group, unless set."""
        return self.identity_audience or f"spotmorph/{self.project}/{self.zone}/{self.instance_group}"

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not _PROJECT.match(value):
            raise ValueError(f"{value!r} is not a project id (6-30 lowercase letters, digits, '-')")
        return value

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not _ZONE.match(value):
            raise ValueError(f"{value!r} is not a zone (like us-central1-a; a regional group is not supported)")
        return value

    @field_validator("instance_group", "on_demand_instance_group")
    @classmethod
    def _group(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"{value!r}: 1-63 lowercase letters, digits and '-', starting with a letter")
        return value

    @field_validator("api_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, "the Compute Engine API")

    @field_validator("identity_certs")
    @classmethod
    def _certs(cls, value: str) -> str:
        if "://" in value:
            return check_url(value, "identity_certs")
        if not Path(value).is_absolute():
            raise ValueError(f"{value!r}: an https:// URL or an absolute file path")
        return value
