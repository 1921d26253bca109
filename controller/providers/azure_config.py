"""Settings of the Azure Spot VM scale-set provider (the ``azure:`` section of the controller's config).

Kept apart from :mod:`controller.providers.azure` so that reading and checking a config never imports
the Azure SDK.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# Azure: resource group names 1-90 chars of letters, digits, '_', '-', '.', '(' and ')', not ending in
# '.'; scale set names 1-64 chars (Linux), letters, digits, '-', '_' and '.'.
_GROUP = re.compile(r"^[-\w.()]{0,89}[-\w()]$")
_SCALE_SET = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}[A-Za-z0-9_]$|^[A-Za-z0-9]$")


class AzureSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subscription_id: str
    resource_group: str
    scale_set: str
    target_capacity: int = Field(ge=0, le=1000)  # VMs the provider keeps in the scale set (its floor)
    # Ceiling when the controller asks for more (busy nodes plus queued jobs' min_gpus); None: target_capacity,
    # i.e. the set never grows past the floor on demand.
    max_capacity: int | None = Field(default=None, ge=0, le=1000)
    slots_per_instance: int = Field(default=1, ge=1, le=64)  # GPUs per VM: the agents' --slots (cloud-init)
    # USD per VM-hour a Spot VM may cost; -1: up to the pay-as-you-go price (evicted for capacity only).
    max_price: float = -1.0
    orchestration_mode: Literal["Uniform", "Flexible"] = "Flexible"
    # None: DefaultAzureCredential (environment, workload identity, managed identity, az login);
    # a client id: that user-assigned managed identity (ManagedIdentityCredential).
    managed_identity_client_id: str | None = None
    poll_seconds: float = Field(default=15.0, gt=0)
    # Operator override: delete instances whose node runs a job (scale-in, release). Off: never.
    delete_busy_nodes: bool = False
    # Backoff after capacity errors (AllocationFailed, SkuNotAvailable, ...): doubles up to the max.
    backoff_seconds: float = Field(default=30.0, gt=0)
    max_backoff_seconds: float = Field(default=900.0, gt=0)
    retries: int = Field(default=3, ge=0, le=10)  # SDK retries (they honour Retry-After) per call
    arm_endpoint: str = "https://management.azure.com"  # sovereign clouds have their own
    # Hand each running VM its own agent token (an HMAC of its name) through a managed Run Command, so a
    # registration proves its VM; off: the VMs share shared_agent_token's token and only claim their names.
    agent_tokens: bool = True
    token_retry_seconds: float = Field(default=60.0, gt=0)  # after a failed hand-over, that VM's next try
    # A second scale set, of Regular priority (on-demand VMs: never evicted, pay-as-you-go), for on-demand
    # capacity (docs/azure.md); None: none, and a request for on-demand capacity is refused.
    on_demand_scale_set: str | None = None
    # The on-demand set's ceiling in VMs (its floor is 0: on-demand VMs only while asked for); None: max_capacity.
    on_demand_max_capacity: int | None = Field(default=None, ge=0, le=1000)

    @model_validator(mode="after")
    def _capacity_range(self) -> AzureSettings:
        if self.max_capacity is not None and self.max_capacity < self.target_capacity:
            raise ValueError(f"max_capacity {self.max_capacity} < target_capacity {self.target_capacity}")
        if self.on_demand_scale_set is not None and self.on_demand_scale_set == self.scale_set:
            raise ValueError(
                f"on_demand_scale_set {self.on_demand_scale_set!r} is the Spot scale_set: name a second scale set "
                "of Regular priority (deploy/azure)"
            )
        return self

    def on_demand(self) -> AzureSettings | None:
        """The settings of the on-demand scale set's provider: its name, floor 0, its ceiling; None: no such set."""
        if self.on_demand_scale_set is None:
            return None
        ceiling = self.on_demand_max_capacity if self.on_demand_max_capacity is not None else self.max_capacity
        return self.model_copy(
            update={
                "scale_set": self.on_demand_scale_set,
                "target_capacity": 0,
                "max_capacity": ceiling if ceiling is not None else self.target_capacity,
                "on_demand_scale_set": None,
            }
        )

    @field_validator("subscription_id")
    @classmethod
    def _subscription(cls, value: str) -> str:
        if not _UUID.match(value):
            raise ValueError(f"{value!r} is not a subscription id (a GUID: `az account show --query id`)")
        return value.lower()

    @field_validator("managed_identity_client_id")
    @classmethod
    def _client_id(cls, value: str | None) -> str | None:
        if value is not None and not _UUID.match(value):
            raise ValueError(f"{value!r} is not a client id (a GUID: `az identity show --query clientId`)")
        return value

    @field_validator("resource_group")
    @classmethod
    def _group(cls, value: str) -> str:
        if not _GROUP.match(value):
            raise ValueError(f"{value!r}: 1-90 letters, digits, '_', '-', '.', '(', ')'; not ending in '.'")
        return value

    @field_validator("scale_set", "on_demand_scale_set")
    @classmethod
    def _scale_set(cls, value: str | None) -> str | None:
        if value is not None and not _SCALE_SET.match(value):
            raise ValueError(f"{value!r}: 1-64 letters, digits, '-', '_', '.'; starting with a letter or digit")
        return value

    @field_validator("max_price")
    @classmethod
    def _price(cls, value: float) -> float:
        if value != -1 and value <= 0:
            raise ValueError(f"{value}: a price in USD per hour (> 0), or -1 for up to the pay-as-you-go price")
        return value

    @field_validator("arm_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not value.startswith("https://"):
            raise ValueError(f"{value!r}: Azure Resource Manager is reached over https://")
        return value.rstrip("/")
