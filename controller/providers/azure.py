"""The Azure provider: a Virtual Machine Scale Set of Spot VMs (azure-mgmt-compute, azure-identity).

Asynchronous SDK (``azure.mgmt.compute.aio``, ``azure.identity.aio``) rather than the blocking client
in threads: the controller is one asyncio loop, so a long-running operation is a task that awaits its
poller, is cancelled cleanly on shutdown, and needs no thread pool sized for the worst case.

What it does on each poll (the controller's provider timer), with one list call (``$expand=instanceView``):

- instances are matched to agents by VM name (cloud-init starts the agent with ``--name`` = the VM name);
  evicted ones (deallocated, stopped, being deleted) are not listed, so their nodes become GONE even when
  the agent never reported a notice;
- evicted instances still in the set (Deallocate policy) are deleted; then the set is scaled to the
  desired capacity (``target_capacity``, raised by what the controller asks for up to ``max_capacity``);
  above it, idle instances are deleted (never one whose node runs a job, unless the operator set
  ``delete_busy_nodes`` or calls ``release(name, force=True)``). What to do is decided by the pure
  functions of :mod:`controller.providers.azure_scale`; this module holds the SDK calls around them, in the
  shell every cloud provider shares (:mod:`controller.providers.operations`);
- each running VM is handed its own agent token (``agent_tokens``, on by default): a managed Run Command
  writes it to ``/etc/spotmorph/agent.token``, where the agent, started by cloud-init, waits for it. The
  token is an HMAC of the VM name (:mod:`controller.tokens`), so a registration proves its VM;
- capacity errors (AllocationFailed, SkuNotAvailable, quota) back off exponentially; throttling (429)
  waits for Retry-After (after the SDK's own retries, which honour it too); a conflict (another
  operation on the set) retries on the next poll. Every error becomes one event, never an exception
  out of a timer. Operations are idempotent (capacity is set, not added), so a controller that restarts
  mid-operation just looks at the set again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.mgmt.compute import models
from azure.mgmt.compute.aio import ComputeManagementClient

from controller.core.events import EventKind
from controller.eventlog import provider_facts as facts
from controller.providers import azure_scale as scale
from controller.providers import azure_tokens, scaling
from controller.providers.azure_config import AzureSettings
from controller.providers.azure_scale import Instance
from controller.providers.base import Clock, ProviderPort, SilentPort, instances_for
from controller.providers.operations import Operations, TokenHandOvers
from controller.providers.operations import ProviderUnavailable as ProviderUnavailable  # the runner skips the poll
from controller.providers.pools import PooledGroups
from controller.providers.scaling import Failure

log = logging.getLogger("spotmorph.controller.azure")

CAPACITY_CODES = frozenset(
    {
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "SkuNotAvailable",
        "QuotaExceeded",
        "OperationNotAllowed",  # what ARM says when a scale-out would exceed the core quota
        "SpotCapacityNotAvailable",
    }
)
K = EventKind


def describe(exc: BaseException) -> Failure:
    """An Azure error as one event: what happened, in words an operator can act on."""
    if isinstance(exc, ClientAuthenticationError):
        return Failure(K.PROVIDER_AUTH_FAILED, f"not authorised: {_short(exc)} (check the identity and its role)")
    if isinstance(exc, HttpResponseError):
        status, code = exc.status_code, _code(exc)
        if status == 429:
            after = _retry_after(exc)
            return Failure(scaling.THROTTLED, f"throttled (429), retry after {after:g} s", after)
        if code in CAPACITY_CODES:
            return Failure(scaling.CAPACITY_UNAVAILABLE, f"{code}: {_short(exc)}")
        if status == 409:
            return Failure(K.PROVIDER_CONFLICT, f"conflict (another operation on the scale set?): {_short(exc)}")
        if isinstance(exc, ResourceNotFoundError) or status == 404:
            return Failure(K.PROVIDER_NOT_FOUND, f"not found: {_short(exc)} (check resource_group and scale_set)")
        if status in (401, 403):
            return Failure(K.PROVIDER_AUTH_FAILED, f"{status}: {_short(exc)} (check the identity's role assignment)")
        return Failure(K.PROVIDER_ERROR, f"{status} {code or ''}: {_short(exc)}".replace("  ", " "))
    if isinstance(exc, ServiceRequestError):
        return Failure(K.PROVIDER_UNREACHABLE, f"cannot reach Azure Resource Manager: {_short(exc)}")
    if isinstance(exc, AzureError):
        return Failure(K.PROVIDER_ERROR, _short(exc))
    return Failure(K.PROVIDER_ERROR, f"{type(exc).__name__}: {exc}")


def _short(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return " ".join(str(text).split())[:300]


def _code(exc: HttpResponseError) -> str | None:
    code = getattr(exc.error, "code", None)
    if code:
        return str(code)
    with contextlib.suppress(Exception):
        response: Any = exc.response
        body = response.json() if response is not None else None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            return str(body["error"].get("code"))
    return None


def _retry_after(exc: HttpResponseError) -> float:
    response: Any = exc.response
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return max(1.0, float(value)) if value is not None else scaling.DEFAULT_RETRY_AFTER_SECONDS
    except ValueError:
        return scaling.DEFAULT_RETRY_AFTER_SECONDS


def make_credential(settings: AzureSettings) -> Any:
    from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

    if settings.managed_identity_client_id:
        return ManagedIdentityCredential(client_id=settings.managed_identity_client_id)
    return DefaultAzureCredential()


class AzureScaleSetProvider(PooledGroups):
    """The Provider protocol over a Spot VM scale set, and a Regular one for on-demand capacity where configured
    (``on_demand_scale_set``: a provider of this class over it, :mod:`controller.providers.pools`); see the
    module docstring."""

    on_demand_setting = "azure.on_demand_scale_set (a scale set of Regular priority: docs/azure.md)"

    def __init__(
        self,
        settings: AzureSettings,
        clock: Clock,
        port: ProviderPort | None = None,
        *,
        credential: Any | None = None,
        vm_token: Callable[[str], str] | None = None,
        **client_options: Any,  # tests: transport=..., polling_interval=0
    ) -> None:
        """``vm_token``: the agent token of a VM by name (controller.tokens); None hands out none."""
        self.settings = settings
        self.clock = clock
        self.port: ProviderPort = port or SilentPort()
        self.credential = credential if credential is not None else make_credential(settings)
        self.client = ComputeManagementClient(
            self.credential,
            settings.subscription_id,
            base_url=settings.arm_endpoint,
            credential_scopes=[f"{settings.arm_endpoint}/.default"],
            retry_total=settings.retries,
            **client_options,
        )
        self.instances: dict[str, Instance] = {}  # the last list, by VM name
        self.wanted_slots = 0  # the controller's last request_capacity
        backoff = (settings.backoff_seconds, settings.max_backoff_seconds)
        self.ops = Operations(settings.scale_set, clock, self.port, describe, backoff, log)
        self.pending = self.ops.pending  # "scale", "clean", "release:NAME", "token:NAME"
        self.tokens: TokenHandOvers | None = None  # None: no agent tokens handed out
        if vm_token is not None and settings.agent_tokens:
            self.tokens = TokenHandOvers(self.ops, vm_token, settings.token_retry_seconds)
        on_demand = settings.on_demand()
        if on_demand is not None:  # the Regular set: the same credential and client options, its own operations
            self.on_demand = AzureScaleSetProvider(
                on_demand, clock, self.port, credential=self.credential, vm_token=vm_token, **client_options
            )

    @property
    def desired(self) -> int:
        """The capacity the set is scaled to: the operator's floor, raised by the controller's ask."""
        s = self.settings
        wanted = instances_for(self.wanted_slots, s.slots_per_instance)
        return scaling.desired_capacity(s.target_capacity, s.max_capacity, wanted)

    @property
    def backoff(self) -> scaling.Backoff:
        return self.ops.backoff

    # -- the Provider protocol

    async def list_group(self) -> frozenset[str]:
        self.ops.check_readable()  # Retry-After: not even a read before then
        listed = await self.ops.read(self._list())
        self.instances = {i.name: i for i in listed}
        await self._maintain(listed)
        return frozenset(i.name for i in listed if not i.evicted)

    async def request_group(self, slots: int) -> None:
        """Aim the set at the controller's level (within target and max); the next poll scales it."""
        self.wanted_slots = slots
        s = self.settings
        wanted = instances_for(slots, s.slots_per_instance)
        if wanted > self.desired:
            message = f"{wanted} VM(s) wanted, at most {self.desired} (max_capacity)"
            self.ops.event(facts.ProviderCapacityLimited(self.scale_set, message, wanted, self.desired))

    async def release_group(self, name: str, *, force: bool = False) -> None:
        """Delete the instance of a node the controller gave up on (GONE, LOST) — never a busy one."""
        if not self.ops.may_release(name, delete_busy=self.settings.delete_busy_nodes, force=force):
            return
        instance = self.instances.get(name)
        if instance is None:
            return  # not (or no longer) in the scale set
        await self.ops.run(f"release:{name}", self._delete([instance], f"release {name}"))

    async def close_group(self) -> None:
        await self.ops.close()
        await self.client.close()

    async def close(self) -> None:
        """Both sets' work and clients, then the credential they share."""
        await super().close()
        close = getattr(self.credential, "close", None)
        if close is not None:
            await close()

    def status(self) -> dict[str, Any]:
        alive = [i for i in self.instances.values() if not i.evicted]
        return {
            "scale_set": self.settings.scale_set,
            "target_capacity": self.settings.target_capacity,
            "desired_capacity": self.desired,
            "instances": len(alive),
            "evicted": len(self.instances) - len(alive),
            **self.ops.status(),
            **({"on_demand": self.on_demand.status()} if isinstance(self.on_demand, AzureScaleSetProvider) else {}),
        }

    # -- Azure calls

    async def _list(self) -> list[Instance]:
        s = self.settings
        found: list[Instance] = []
        if s.orchestration_mode == "Uniform":
            vms = self.client.virtual_machine_scale_set_vms.list(s.resource_group, s.scale_set, expand="instanceView")
            async for vm in vms:
                found.append(_instance(vm.name, vm.instance_id, vm.properties, vm.location))
        else:
            scale_set_id = (
                f"/subscriptions/{s.subscription_id}/resourceGroups/{s.resource_group}"
                f"/providers/Microsoft.Compute/virtualMachineScaleSets/{s.scale_set}"
            )
            listing = self.client.virtual_machines.list(
                s.resource_group, filter=f"'virtualMachineScaleSet/id' eq '{scale_set_id}'", expand="instanceView"
            )
            async for machine in listing:
                found.append(_instance(machine.name, machine.name, machine.properties, machine.location))
        return found

    async def _maintain(self, listed: list[Instance]) -> None:
        """Start what the plan says (cleanup, scale-out, scale-in); each runs as a background task."""
        busy = frozenset(i.name for i in listed if self.port.busy(i.name))
        desired = self.desired
        plan = scale.plan_scale(
            listed,
            desired,
            busy,
            delete_busy=self.settings.delete_busy_nodes,
            pending=self.pending.keys(),
            now=self.clock.now(),
            backoff=self.backoff,
        )
        if plan.clean:
            await self.ops.run(scaling.CLEAN, self._delete(list(plan.clean), "remove evicted instances"))
        if plan.scale_out is not None:
            await self.ops.run(scaling.SCALE, self._scale_out(plan.scale_out))
        if plan.deferred:
            message = f"{plan.deferred} instance(s) above the desired {desired} run jobs"
            self.ops.event(facts.ProviderScaleInDeferred(self.scale_set, message))
        if plan.scale_in:
            await self.ops.run(scaling.SCALE, self._delete(list(plan.scale_in), f"scale in to {desired}"))
        if self.tokens is not None:
            tokens = self.tokens
            tokens.keep_only({i.name for i in listed})  # a name Azure reuses is a new VM: it gets its token again
            for instance in tokens.needing(listed, lambda i: i.name):
                tokens.start(instance.name, functools.partial(self._hand_token, instance), _short)

    async def _hand_token(self, instance: Instance, token: str) -> None:
        """Write VM ``instance``'s own agent token to its /etc/spotmorph/agent.token by a managed Run Command;
        deleted once done, so nothing of it stays on the VM's model."""
        await azure_tokens.hand_over(self.client, self.settings, instance, token)

    async def _scale_out(self, out: scale.ScaleOut) -> None:
        s = self.settings
        scale_set = await self.client.virtual_machine_scale_sets.get(s.resource_group, s.scale_set)
        current = scale_set.sku.capacity if scale_set.sku is not None and scale_set.sku.capacity is not None else 0
        wanted = scale.capacity_to_set(current, self.desired, out.dying)
        if wanted is None:
            return
        update = models.VirtualMachineScaleSetUpdate(sku=models.Sku(capacity=wanted))
        profile = scale_set.properties.virtual_machine_profile if scale_set.properties else None
        price = profile.billing_profile.max_price if profile and profile.billing_profile else None
        if price is not None and price != s.max_price:
            billing = models.BillingProfile(max_price=s.max_price)
            vm_profile = models.VirtualMachineScaleSetUpdateVMProfile(billing_profile=billing)
            update.properties = models.VirtualMachineScaleSetUpdateProperties(virtual_machine_profile=vm_profile)
        message = f"capacity {current} -> {wanted} ({out.running} running)"
        self.ops.event(facts.ProviderScaleOut(self.scale_set, message, wanted))
        poller = await self.client.virtual_machine_scale_sets.begin_update(s.resource_group, s.scale_set, update)
        await poller.result()
        self.ops.event(facts.ProviderScaleOutDone(self.scale_set, f"capacity {wanted}", wanted))

    async def _delete(self, instances: list[Instance], why: str) -> None:
        s = self.settings
        ids = models.VirtualMachineScaleSetVMInstanceRequiredIDs(instance_ids=[i.instance_id for i in instances])
        names = sorted(i.name for i in instances)
        self.ops.event(facts.ProviderDeleteInstances(self.scale_set, f"{why}: {', '.join(names)}", names))
        try:
            poller = await self.client.virtual_machine_scale_sets.begin_delete_instances(
                s.resource_group, s.scale_set, ids
            )
            await poller.result()
        except ResourceNotFoundError:
            return  # already gone: what we wanted

    @property
    def scale_set(self) -> str:
        return self.settings.scale_set


def _instance(name: str | None, instance_id: str | None, properties: Any, location: str | None = None) -> Instance:
    provisioning = str(getattr(properties, "provisioning_state", None) or "Unknown")
    view = getattr(properties, "instance_view", None)
    power = "unknown"
    for status in getattr(view, "statuses", None) or []:
        code = str(status.code or "")
        if code.startswith("PowerState/"):
            power = code.split("/", 1)[1].lower()
    return Instance(str(name), str(instance_id or name), provisioning, power, str(location or ""))
