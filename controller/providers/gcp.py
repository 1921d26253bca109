"""The GCP provider: a zonal managed instance group of Spot VMs (google-cloud-compute over its REST transport).

The client is synchronous, so every call runs in a small thread pool of the provider's own with a
deadline (``request_timeout_seconds``), and the controller's event loop never waits on Google; a zone
operation (resize, deleteInstances) is polled from the loop, one call per look, so shutting down cancels
it cleanly. What it does on each poll (the controller's provider timer), with one listManagedInstances:

- instances are matched to agents by name (the startup script starts the agent with ``--name`` = the
  instance name); stopped, terminated, recreated and deleted ones are not listed, so their nodes become
  GONE even when the agent never reported a notice;
- stopped instances (termination action STOP) are deleted; the group is grown to the desired size
  (``target_capacity``, raised by what the controller asks for up to ``max_capacity``) by a resize, which
  only ever grows it: above the desired size, chosen idle instances are deleted by name (never one whose
  node runs a job, unless the operator allows it), so the group never picks a busy VM to drop. What to
  do is decided by the pure :mod:`controller.providers.gcp_scale`;
- why the group could not create instances (a stockout, quota: each instance's last attempt) is an event;
  the group keeps trying on its own;
- throttled (429, 403 rateLimitExceeded) and unreachable calls are retried ``retries`` times after a
  growing wait (Retry-After when given), then become one event and a backoff; capacity and quota errors
  back off exponentially. No error leaves a timer as an exception.

Each VM proves who it is with its instance identity token (:meth:`verify_identity`, for the controller's
Identity service): a JWT Google signed naming the instance, checked against the group's list.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import compute_v1

from controller.eventlog import provider_facts as facts
from controller.providers import gcp_identity as identity
from controller.providers import gcp_scale as scale
from controller.providers import scaling
from controller.providers.base import Clock, ProviderPort, SilentPort, instances_for
from controller.providers.gcp_config import GcpSettings
from controller.providers.gcp_errors import OperationFailed, describe, retry_wait, short
from controller.providers.gcp_scale import Managed
from controller.providers.identity import IdentityNotOffered, IdentityRefused, IdentityUnavailable
from controller.providers.operations import Operations, Threads
from controller.providers.operations import ProviderUnavailable as ProviderUnavailable  # the runner skips the poll
from controller.providers.pools import PooledGroups
from morphing.errors import UserInputError

log = logging.getLogger("spotmorph.controller.gcp")
T = TypeVar("T")
THREADS = 4  # calls at once: a list, a resize, a delete, an identity check's list
IDENTITY_RELIST_SECONDS = 5.0  # an identity naming an instance not in the last list lists again, at most this often


def credentials_for(settings: GcpSettings) -> Credentials | None:
    """Anonymous for a local fake (an http:// endpoint on loopback); else None: Application Default Credentials."""
    endpoint = settings.api_endpoint
    return AnonymousCredentials() if endpoint and urlsplit(endpoint).scheme == "http" else None  # type: ignore[no-untyped-call]


class GcpInstanceGroupProvider(PooledGroups):
    """The Provider protocol over a managed instance group of Spot VMs, and one of standard VMs for on-demand
    capacity where configured (a provider of this class over it, :mod:`controller.providers.pools`); see the
    module docstring."""

    on_demand_setting = "gcp.on_demand_instance_group (a group of standard VMs, without Spot scheduling: docs/gcp.md)"

    def __init__(
        self,
        settings: GcpSettings,
        clock: Clock,
        port: ProviderPort | None = None,
        *,
        credentials: Credentials | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``sleep``: how the provider waits between retries and operation polls (tests record it);
        ``wall``: the time identity tokens' ``exp`` is checked against."""
        self.settings = settings
        self.clock = clock
        self.port: ProviderPort = port or SilentPort()
        options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
        creds = credentials or credentials_for(settings)
        try:
            self.groups = compute_v1.InstanceGroupManagersClient(
                credentials=creds, transport="rest", client_options=options
            )
            self.operations = compute_v1.ZoneOperationsClient(
                credentials=creds, transport="rest", client_options=options
            )
        except DefaultCredentialsError as exc:
            raise UserInputError(
                f"provider: gcp has no Google credentials ({short(exc)}): run the controller on a VM with a service "
                "account, or `gcloud auth application-default login` (docs/gcp.md)"
            ) from None
        self.threads = Threads(THREADS, "spotmorph-gcp", sleep, log)
        self.instances: dict[str, Managed] = {}  # the last list, by instance name
        self.wanted_slots = 0  # the controller's last request_capacity
        backoff = (settings.backoff_seconds, settings.max_backoff_seconds)
        self.ops = Operations(settings.instance_group, clock, self.port, describe, backoff, log)
        self.pending = self.ops.pending  # "scale", "clean", "release:NAME"
        self._creation_errors: frozenset[str] = frozenset()  # those already reported
        self._identity_listed_at = float("-inf")
        self.keys = identity.SigningKeys(
            settings.identity_certs, settings.identity_certs_refresh_seconds, wall, self.threads.call
        )
        self.wall = wall
        on_demand = settings.on_demand()
        if on_demand is not None:  # its own clients, threads and operations
            self.on_demand = GcpInstanceGroupProvider(
                on_demand, clock, self.port, credentials=credentials, sleep=sleep, wall=wall
            )

    @property
    def desired(self) -> int:
        """The group's size to keep: the operator's floor, raised by the controller's ask up to the ceiling."""
        s = self.settings
        wanted = instances_for(self.wanted_slots, s.slots_per_instance)
        return scaling.desired_capacity(s.target_capacity, s.max_capacity, wanted)

    @property
    def group(self) -> str:
        return self.settings.instance_group

    @property
    def backoff(self) -> scaling.Backoff:
        return self.ops.backoff

    # -- the Provider protocol

    async def list_group(self) -> frozenset[str]:
        self.ops.check_readable()  # rate limited: not even a read before then
        listed = await self._relist()
        self._report_creation_errors(listed)
        await self._maintain(listed)
        return frozenset(i.name for i in listed if i.alive)

    async def request_group(self, slots: int) -> None:
        """Aim the group at the controller's level (within target and max); the next poll resizes it."""
        self.wanted_slots = slots
        wanted = instances_for(slots, self.settings.slots_per_instance)
        if wanted > self.desired:
            message = f"{wanted} VM(s) wanted, at most {self.desired} (max_capacity)"
            self.ops.event(facts.ProviderCapacityLimited(self.group, message, wanted, self.desired))

    async def release_group(self, name: str, *, force: bool = False) -> None:
        """Delete the instance of a node the controller gave up on (GONE, LOST): never a busy one."""
        if not self.ops.may_release(name, delete_busy=self.settings.delete_busy_nodes, force=force):
            return
        instance = self.instances.get(name)
        if instance is None or instance.leaving:
            return  # not (or no longer) in the group
        await self.ops.run(f"release:{name}", self._delete([instance], f"release {name}"))

    async def close_group(self) -> None:
        await self.ops.close()
        self.threads.shutdown()
        self.groups.transport.close()  # type: ignore[no-untyped-call]
        self.operations.transport.close()  # type: ignore[no-untyped-call]

    def status(self) -> dict[str, Any]:
        return {
            "instance_group": self.group,
            "target_capacity": self.settings.target_capacity,
            "desired_capacity": self.desired,
            "instances": sum(1 for i in self.instances.values() if i.alive),
            **self.ops.status(),
            **({"on_demand": self.on_demand.status()} if isinstance(self.on_demand, GcpInstanceGroupProvider) else {}),
        }

    # -- identity (controller.providers.identity.IdentityVerifier)

    async def verify_identity(self, document: str) -> str:
        """The instance name a signed identity token proves, if it names an instance of this group or, refused
        there, of the on-demand group."""
        try:
            return await self._verify_in_group(document)
        except IdentityRefused:
            if not isinstance(self.on_demand, GcpInstanceGroupProvider):
                raise
            return await self.on_demand._verify_in_group(document)

    async def _verify_in_group(self, document: str) -> str:
        s = self.settings
        if not s.agent_tokens:
            raise IdentityNotOffered("this controller hands out no per-VM tokens (gcp.agent_tokens is off)")
        key = await self.keys.get(identity.key_id(document))
        proven = identity.verify(document, key, s.audience, self.wall())
        if (proven.project, proven.zone) != (s.project, s.zone):
            raise IdentityRefused(f"instance of {proven.project[:64]}/{proven.zone[:64]}, not of {s.project}/{s.zone}")
        found = self.instances.get(proven.instance_name)
        now = self.clock.now()
        if (found is None or found.instance_id != proven.instance_id) and now >= self._identity_listed_at + (
            IDENTITY_RELIST_SECONDS
        ):
            self._identity_listed_at = now
            if not self.backoff.may_read(now):
                raise IdentityUnavailable("the group cannot be listed right now (rate limited)")
            try:
                found = {i.name: i for i in await self._relist()}.get(proven.instance_name)
            except ProviderUnavailable:
                raise IdentityUnavailable("the group cannot be listed right now") from None
        if found is None or found.instance_id != proven.instance_id or not found.alive:
            raise IdentityRefused(f"instance {proven.instance_name[:64]!r} is not (or no longer) in group {self.group}")
        return found.name

    # -- Compute Engine calls

    async def _relist(self) -> list[Managed]:
        s = self.settings

        def fetch() -> list[Managed]:
            pages = self.groups.list_managed_instances(
                project=s.project,
                zone=s.zone,
                instance_group_manager=s.instance_group,
                retry=None,
                timeout=s.request_timeout_seconds,
            )
            return [_managed(m) for m in pages]

        listed = await self.ops.read(self._call(fetch), short)
        self.instances = {i.name: i for i in listed}
        return listed

    async def _maintain(self, listed: list[Managed]) -> None:
        """Start what the plan says (delete stopped, grow, delete idle extras); each runs as a background task."""
        busy = frozenset(i.name for i in listed if self.port.busy(i.name))
        desired = self.desired
        plan = scale.plan(
            listed,
            desired,
            busy,
            delete_busy=self.settings.delete_busy_nodes,
            pending=self.pending.keys(),
            now=self.clock.now(),
            backoff=self.backoff,
        )
        if plan.clean:
            await self.ops.run(scaling.CLEAN, self._delete(list(plan.clean), "remove stopped instances"))
        if plan.resize is not None:
            alive = sum(1 for i in listed if i.alive)
            await self.ops.run(scaling.SCALE, self._resize(plan.resize, alive))
        if plan.deferred:
            message = f"{plan.deferred} instance(s) above the desired {desired} run jobs"
            self.ops.event(facts.ProviderScaleInDeferred(self.group, message))
        if plan.scale_in:
            await self.ops.run(scaling.SCALE, self._delete(list(plan.scale_in), f"scale in to {desired}"))

    async def _resize(self, wanted: int, alive: int) -> None:
        s = self.settings
        project, zone, name, timeout = s.project, s.zone, s.instance_group, s.request_timeout_seconds
        group = await self._call(
            lambda: self.groups.get(
                project=project, zone=zone, instance_group_manager=name, retry=None, timeout=timeout
            )
        )
        current = int(group.target_size)
        if current >= wanted:
            return  # asked for already (by this controller before a restart, or an operation still running)
        self.ops.event(facts.ProviderScaleOut(self.group, f"targetSize {current} -> {wanted} ({alive} alive)", wanted))
        operation = await self._call(
            lambda: self.groups.resize_unary(
                project=project, zone=zone, instance_group_manager=name, size=wanted, retry=None, timeout=timeout
            )
        )
        await self._wait(operation)
        self.ops.event(facts.ProviderScaleOutDone(self.group, f"targetSize {wanted}", wanted))

    async def _delete(self, instances: list[Managed], why: str) -> None:
        s = self.settings
        names = sorted(i.name for i in instances)
        self.ops.event(facts.ProviderDeleteInstances(self.group, f"{why}: {', '.join(names)}", names))
        body = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
            instances=[f"zones/{s.zone}/instances/{name}" for name in names],
            skip_instances_on_validation_error=True,  # one already gone does not fail the others
        )
        operation = await self._call(
            lambda: self.groups.delete_instances_unary(
                project=s.project,
                zone=s.zone,
                instance_group_manager=s.instance_group,
                instance_group_managers_delete_instances_request_resource=body,
                retry=None,
                timeout=s.request_timeout_seconds,
            )
        )
        await self._wait(operation)

    async def _wait(self, operation: compute_v1.Operation) -> None:
        """Until the zone operation is DONE, looking every ``operation_poll_seconds``; its errors are raised."""
        s = self.settings
        deadline = asyncio.get_running_loop().time() + s.operation_timeout_seconds
        name = operation.name
        while operation.status != compute_v1.Operation.Status.DONE:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"operation {name} not done within {s.operation_timeout_seconds:g} s")
            await self.threads.sleep(s.operation_poll_seconds)
            operation = await self._call(
                lambda: self.operations.get(
                    project=s.project, zone=s.zone, operation=name, retry=None, timeout=s.request_timeout_seconds
                )
            )
        errors = list(operation.error.errors) if operation.error else []
        if errors:
            message = "; ".join(f"{e.code}: {e.message}" for e in errors[:5])
            status = int(operation.http_error_status_code or 0)
            raise OperationFailed(f"{operation.operation_type} {name}", [e.code for e in errors], message, status)

    async def _call(self, call: Callable[[], T]) -> T:
        """``call`` in the provider's threads, within its deadline; throttled or unreachable ones are retried."""
        s = self.settings
        wait = functools.partial(retry_wait, first=s.retry_seconds)
        return await self.threads.retried(call, 2 * s.request_timeout_seconds, s.retries, wait)

    def _report_creation_errors(self, listed: list[Managed]) -> None:
        """Why the group cannot create instances (it keeps trying itself): one event per new reason."""
        found = scale.creation_errors(listed)
        for text, (capacity, message) in found.items():
            if text not in self._creation_errors:
                fact = facts.ProviderCapacityUnavailable if capacity else facts.ProviderError
                self.ops.event(fact(self.group, f"creating instances: {message}", "create", None))
        self._creation_errors = frozenset(found)


def _managed(m: compute_v1.ManagedInstance) -> Managed:
    """One listed instance; its name from ``name``, else the last part of its ``instance`` URL."""
    name = m.name or m.instance.rsplit("/", 1)[-1]
    errors: tuple[tuple[str, str], ...] = ()
    if m.last_attempt and m.last_attempt.errors:
        errors = tuple((e.code, short(e.message)) for e in list(m.last_attempt.errors.errors)[:5])
    return Managed(name, str(m.id) if m.id else "", m.instance_status, m.current_action or "NONE", errors)
