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
  functions of :mod:`controller.providers.azure_scale`; this module is the SDK shell around them;
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

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
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
from controller.providers import azure_tokens
from controller.providers.azure_config import AzureSettings
from controller.providers.azure_scale import Failure, Instance
from controller.providers.base import CannotList, Clock, ProviderPort, SilentPort, instances_for

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
INFO_EVENTS = frozenset(
    {
        EventKind.PROVIDER_SCALE_OUT,
        EventKind.PROVIDER_SCALE_OUT_DONE,
        EventKind.PROVIDER_DELETE_INSTANCES,
        EventKind.PROVIDER_AGENT_TOKEN_DELIVERED,
    }
)


K = EventKind


class ProviderUnavailable(CannotList):
    """No instance list this time (Azure unreachable, throttled, ...): the runner skips the poll."""


def describe(exc: BaseException) -> Failure:
    """An Azure error as one event: what happened, in words an operator can act on."""
    if isinstance(exc, ClientAuthenticationError):
        return Failure(K.PROVIDER_AUTH_FAILED, f"not authorised: {_short(exc)} (check the identity and its role)")
    if isinstance(exc, HttpResponseError):
        status, code = exc.status_code, _code(exc)
        if status == 429:
            after = _retry_after(exc)
            return Failure(scale.THROTTLED, f"throttled (429), retry after {after:g} s", after)
        if code in CAPACITY_CODES:
            return Failure(scale.CAPACITY_UNAVAILABLE, f"{code}: {_short(exc)}")
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
        return max(1.0, float(value)) if value is not None else scale.DEFAULT_RETRY_AFTER_SECONDS
    except ValueError:
        return scale.DEFAULT_RETRY_AFTER_SECONDS


def make_credential(settings: AzureSettings) -> Any:
    from azure.identity.aio import DefaultAzureCredential, ManagedIdentityCredential

    if settings.managed_identity_client_id:
        return ManagedIdentityCredential(client_id=settings.managed_identity_client_id)
    return DefaultAzureCredential()


class AzureScaleSetProvider:
    """The Provider protocol over one Spot VM scale set; see the module docstring."""

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
        self.backoff = scale.Backoff()
        self.pending: dict[str, asyncio.Task[None]] = {}  # "scale", "clean", "release:NAME"
        self._failing: dict[str, str] = {}  # failure kind -> its message, until an operation succeeds
        self.vm_token = vm_token if settings.agent_tokens else None
        self.tokens_delivered: set[str] = set()  # VMs handed their token (again after a controller restart)
        self.token_retry_at: dict[str, float] = {}  # VM -> when its failed hand-over is tried again

    @property
    def desired(self) -> int:
        """The capacity the set is scaled to: the operator's floor, raised by the controller's ask."""
        s = self.settings
        wanted = instances_for(self.wanted_slots, s.slots_per_instance)
        return scale.desired_capacity(s.target_capacity, s.max_capacity, wanted)

    # -- the Provider protocol

    async def list_instances(self) -> frozenset[str]:
        if not self.backoff.may_read(self.clock.now()):  # Retry-After: not even a read before then
            raise ProviderUnavailable(f"throttled until {self.backoff.throttled_until:.0f}")
        try:
            listed = await self._list()
        except Exception as exc:  # every Azure error is an event, never an exception out of a timer
            self._failed("list", exc)
            raise ProviderUnavailable(str(exc)) from None
        self.instances = {i.name: i for i in listed}
        await self._maintain(listed)
        return frozenset(i.name for i in listed if not i.evicted)

    async def request_capacity(self, slots: int) -> None:
        """Aim the set at the controller's level (within target and max); the next poll scales it."""
        self.wanted_slots = slots
        s = self.settings
        wanted = instances_for(slots, s.slots_per_instance)
        if wanted > self.desired:
            message = f"{wanted} VM(s) wanted, at most {self.desired} (max_capacity)"
            self._event(facts.ProviderCapacityLimited(self.scale_set, message, wanted, self.desired))

    async def release(self, name: str, *, force: bool = False) -> None:
        """Delete the instance of a node the controller gave up on (GONE, LOST) — never a busy one."""
        if not scale.may_delete(self.port.busy(name), delete_busy=self.settings.delete_busy_nodes, force=force):
            why = "the node runs a job; operator override needed"
            self._event(facts.ProviderReleaseRefused(self.scale_set, why, name))
            return
        instance = self.instances.get(name)
        if instance is None:
            return  # not (or no longer) in the scale set
        await self._run(f"release:{name}", self._delete([instance], f"release {name}"))

    async def close(self) -> None:
        for task in list(self.pending.values()):
            task.cancel()
        await asyncio.gather(*self.pending.values(), return_exceptions=True)
        await self.client.close()
        close = getattr(self.credential, "close", None)
        if close is not None:
            await close()

    def status(self) -> dict[str, Any]:
        alive = [i for i in self.instances.values() if not i.evicted]
        now = self.clock.now()
        return {
            "scale_set": self.settings.scale_set,
            "target_capacity": self.settings.target_capacity,
            "desired_capacity": self.desired,
            "instances": len(alive),
            "evicted": len(self.instances) - len(alive),
            "pending": sorted(self.pending),
            "backoff_until": self.backoff.not_before if now < self.backoff.not_before else None,
            "throttled_until": self.backoff.throttled_until if now < self.backoff.throttled_until else None,
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
            await self._run(scale.CLEAN, self._delete(list(plan.clean), "remove evicted instances"))
        if plan.scale_out is not None:
            await self._run(scale.SCALE, self._scale_out(plan.scale_out))
        if plan.deferred:
            message = f"{plan.deferred} instance(s) above the desired {desired} run jobs"
            self._event(facts.ProviderScaleInDeferred(self.scale_set, message))
        if plan.scale_in:
            await self._run(scale.SCALE, self._delete(list(plan.scale_in), f"scale in to {desired}"))
        if self.vm_token is not None:
            gone = set(self.tokens_delivered) - {i.name for i in listed}
            self.tokens_delivered -= gone  # a name Azure reuses is a new VM: it gets its token again
            now = self.clock.now()
            for instance in scale.needing_token(listed, self.tokens_delivered, self.token_retry_at, self.pending, now):
                key = f"{scale.TOKEN_TASK}:{instance.name}"
                self.pending[key] = asyncio.ensure_future(self._hand_token(key, instance, self.vm_token))

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
        self._event(facts.ProviderScaleOut(self.scale_set, message, wanted))
        poller = await self.client.virtual_machine_scale_sets.begin_update(s.resource_group, s.scale_set, update)
        await poller.result()
        self._event(facts.ProviderScaleOutDone(self.scale_set, f"capacity {wanted}", wanted))

    async def _delete(self, instances: list[Instance], why: str) -> None:
        s = self.settings
        ids = models.VirtualMachineScaleSetVMInstanceRequiredIDs(instance_ids=[i.instance_id for i in instances])
        names = sorted(i.name for i in instances)
        self._event(facts.ProviderDeleteInstances(self.scale_set, f"{why}: {', '.join(names)}", names))
        try:
            poller = await self.client.virtual_machine_scale_sets.begin_delete_instances(
                s.resource_group, s.scale_set, ids
            )
            await poller.result()
        except ResourceNotFoundError:
            return  # already gone: what we wanted

    async def _hand_token(self, key: str, instance: Instance, vm_token: Callable[[str], str]) -> None:
        """Write VM ``instance``'s own agent token to its /etc/spotmorph/agent.token by a managed Run Command.

        A failure is this VM's alone: an event, and another try after ``token_retry_seconds``, while the
        set's backoff (capacity, throttling) is left as it is. The Run Command is deleted once done, so
        nothing of it stays on the VM's model."""
        s = self.settings
        try:
            await azure_tokens.hand_over(self.client, s, instance, vm_token(instance.name))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry_at = self.clock.now() + s.token_retry_seconds
            self.token_retry_at[instance.name] = retry_at
            message = f"{instance.name}: {_short(exc)}"
            self._event(facts.ProviderAgentTokenFailed(self.scale_set, message, instance.name, retry_at))
        else:
            self.tokens_delivered.add(instance.name)
            self.token_retry_at.pop(instance.name, None)
            self._event(facts.ProviderAgentTokenDelivered(self.scale_set, instance.name, instance.name))
        finally:
            self.pending.pop(key, None)

    async def _run(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        """Start ``work`` in the background; its outcome resets or extends the backoff."""

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(key.split(":")[0], exc)
            else:
                self.backoff = scale.after_success(self.backoff)
                self._failing.clear()
            finally:
                self.pending.pop(key, None)

        self.pending[key] = asyncio.ensure_future(guarded())
        await asyncio.sleep(0)  # let it send its first request now

    def _failed(self, what: str, exc: BaseException) -> None:
        failure = describe(exc)
        now = self.clock.now()
        s = self.settings
        self.backoff = scale.after_failure(self.backoff, failure, now, s.backoff_seconds, s.max_backoff_seconds)
        if self._failing.get(failure.kind) == failure.message:
            log.warning("%s (again): %s", failure.kind, failure.message)
            return  # the same failure on every poll is one event, not one a poll
        self._failing[failure.kind] = failure.message
        fact = facts.CALL_FAILURES[failure.kind]
        self._event(fact(self.scale_set, failure.message, what, self.backoff.retry_at(now)))

    @property
    def scale_set(self) -> str:
        return self.settings.scale_set

    def _event(self, fact: facts.ScaleSetFact) -> None:
        log.log(logging.INFO if fact.kind in INFO_EVENTS else logging.WARN, "%s: %s", fact.kind, fact.message)
        self.port.report(fact)


def _instance(name: str | None, instance_id: str | None, properties: Any, location: str | None = None) -> Instance:
    provisioning = str(getattr(properties, "provisioning_state", None) or "Unknown")
    view = getattr(properties, "instance_view", None)
    power = "unknown"
    for status in getattr(view, "statuses", None) or []:
        code = str(status.code or "")
        if code.startswith("PowerState/"):
            power = code.split("/", 1)[1].lower()
    return Instance(str(name), str(instance_id or name), provisioning, power, str(location or ""))
