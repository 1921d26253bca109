"""Settings of the AWS Spot Auto Scaling group provider (the ``aws:`` section of the controller's config).

Kept apart from :mod:`controller.providers.aws` so that reading and checking a config never imports boto3.
Each field's docstring is its description (docs/aws.md lists them; a test holds the two together).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Commercial, GovCloud and China regions: us-east-1, us-gov-west-1, cn-north-1, ap-southeast-4, ...
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}$")
# The API allows 1-255 characters; names CloudFormation makes (stack-Group-ABC123) and hand-made ones use these.
_GROUP = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,254}$")
_PROFILE = re.compile(r"^[-A-Za-z0-9_.@+=]{1,64}$")


class AwsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    region: str
    """The group's region (``us-east-1``, ...)."""
    auto_scaling_group: str
    """The Auto Scaling group of Spot instances, made by the operator's CloudFormation (deploy/aws/)."""
    slots_per_instance: int = Field(default=1, ge=1, le=64)
    """GPUs per instance (the agents' slots): a level of N slots is N / this instances, rounded up."""
    min_capacity: int = Field(default=0, ge=0, le=1000)
    """Instances the provider keeps in the group whatever the controller asks for (its floor)."""
    max_capacity: int | None = Field(default=None, ge=0, le=1000)
    """Instances the group may grow to on demand; None: the group's own MaxSize."""
    poll_seconds: float = Field(default=15.0, gt=0)
    """How often the controller lists the group's instances (one DescribeAutoScalingGroups call)."""
    delete_busy_nodes: bool = False
    """Operator override: terminate instances whose node runs a job (scale-in, release); off: never."""
    endpoint_url: str | None = Field(default=None, max_length=2048)
    """Every AWS API at this URL instead of the region's endpoints (a local fake in tests); None: AWS's own."""
    profile: str | None = None
    """A named profile of ~/.aws/config (a workstation); None: the default chain (the instance profile)."""
    call_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    """One AWS call (connect and read) may take this long; then it failed (unreachable)."""
    retries: int = Field(default=3, ge=0, le=10)
    """A throttled, timed-out or failed (5xx) call is tried again this many times, waiting longer each time."""
    retry_base_seconds: float = Field(default=0.5, ge=0, le=60)
    """The first retry's wait; each further one doubles it (with jitter)."""
    throttle_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Still throttled after the retries: no call at all for this long (AWS sends no Retry-After)."""
    backoff_seconds: float = Field(default=30.0, gt=0)
    """After a call refused for capacity or quota, no change to the group for this long, doubling (failed launches
    are the group's own to retry: they are only said)."""
    max_backoff_seconds: float = Field(default=900.0, gt=0)
    """The capacity backoff's cap."""
    agent_tokens: bool = True
    """Hand each running instance its own agent token (an HMAC of its instance id) by SSM Run Command, sealed to a
    key the instance made; off: the instances share one token (shared_agent_token) and only claim their ids."""
    token_retry_seconds: float = Field(default=60.0, gt=0)
    """After a failed hand-over (SSM agent not online yet, ...), that instance's next try."""
    token_timeout_seconds: float = Field(default=120.0, ge=30, le=3600)
    """How long one Run Command of a hand-over may take on the instance before it counts as failed."""
    token_poll_seconds: float = Field(default=1.0, ge=0, le=60)
    """How often the provider asks SSM whether a Run Command of a hand-over has ended."""

    on_demand_auto_scaling_group: str | None = None
    """A second Auto Scaling group, of On-Demand instances only (deploy/aws/), for on-demand capacity; None: none,
    and a request for on-demand capacity is refused."""
    on_demand_max_capacity: int | None = Field(default=None, ge=0, le=1000)
    """The on-demand group's ceiling in instances (its floor is 0); None: its own MaxSize."""

    @model_validator(mode="after")
    def _capacity_range(self) -> AwsSettings:
        if self.max_capacity is not None and self.max_capacity < self.min_capacity:
            raise ValueError(f"max_capacity {self.max_capacity} < min_capacity {self.min_capacity}")
        if self.max_backoff_seconds < self.backoff_seconds:
            raise ValueError(f"max_backoff_seconds {self.max_backoff_seconds} < backoff_seconds {self.backoff_seconds}")
        if self.on_demand_auto_scaling_group == self.auto_scaling_group:
            raise ValueError(
                f"on_demand_auto_scaling_group {self.auto_scaling_group!r} is the Spot group: name the stack's "
                "OnDemandAutoScalingGroupName output (deploy/aws/template.yaml)"
            )
        return self

    def on_demand(self) -> AwsSettings | None:
        """The settings of the on-demand group's provider: its name, floor 0, its ceiling; None: no such group."""
        if self.on_demand_auto_scaling_group is None:
            return None
        update = {"auto_scaling_group": self.on_demand_auto_scaling_group, "on_demand_auto_scaling_group": None}
        return self.model_copy(update={**update, "min_capacity": 0, "max_capacity": self.on_demand_max_capacity})

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.match(value):
            raise ValueError(f"{value[:80]!r} is not an AWS region (such as us-east-1: `aws configure get region`)")
        return value

    @field_validator("auto_scaling_group", "on_demand_auto_scaling_group")
    @classmethod
    def _group(cls, value: str | None) -> str | None:
        if value is not None and not _GROUP.match(value):
            raise ValueError(
                f"{value[:80]!r}: 1-255 letters, digits, '-', '_', '.', starting with a letter or digit (the stack's "
                "AutoScalingGroupName output)"
            )
        return value

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        if value is not None and not _PROFILE.match(value):
            raise ValueError(f"{value[:80]!r} is not a profile name of ~/.aws/config")
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+(/[^\s]*)?$", value):
            raise ValueError(f"{value[:80]!r}: an http:// or https:// URL")
        return value.rstrip("/") if value is not None else None
