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
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import compute_v1

from controller.core.events import EventKind
from controller.eventlog import provider_facts as facts
from controller.providers import azure_scale as backoffs
from controller.providers import gcp_identity as identity
from controller.providers import gcp_scale as scale
from controller.providers.base import CannotList, Clock, ProviderPort, SilentPort, instances_for
from controller.providers.gcp_config import GcpSettings
from controller.providers.gcp_errors import OperationFailed, describe, retry_wait, short
from controller.providers.gcp_scale import Managed
from controller.providers.identity import IdentityNotOffered, IdentityRefused, IdentityUnavailable
from morphing.errors import UserInputError

log = logging.getLogger("spotmorph.controller.gcp")
T = TypeVar("T")
K = EventKind
INFO_EVENTS = frozenset({K.PROVIDER_SCALE_OUT, K.PROVIDER_SCALE_OUT_DONE, K.PROVIDER_DELETE_INSTANCES})
THREADS = 4  # calls at once: a list, a resize, a delete, an identity check's list
IDENTITY_RELIST_SECONDS = 5.0  # an identity naming an instance not in the last list lists again, at most this often


class ProviderUnavailable(CannotList):
    """No instance list this time (the API unreachable, throttled, ...): the runner skips the poll."""


def credentials_for(settings: GcpSettings) -> Credentials | None:
    """Anonymous for a local fake (an http:// endpoint on loopback); else None: Application Default Credentials."""
    endpoint = settings.api_endpoint
    return AnonymousCredentials() if endpoint and urlsplit(endpoint).scheme == "http" else None  # type: ignore[no-untyped-call]


class GcpInstanceGroupProvider:
    """The Provider protocol over one managed instance group of Spot VMs; see the module docstring."""

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
        self.sleep = sleep
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
        self.executor = ThreadPoolExecutor(THREADS, thread_name_prefix="spotmorph-gcp")
        self.instances: dict[str, Managed] = {}  # the last list, by instance name
        self.wanted_slots = 0  # the controller's last request_capacity
        self.backoff = backoffs.Backoff()
        self.pending: dict[str, asyncio.Task[None]] = {}  # "scale", "clean", "release:NAME"
        self._failing: dict[str, str] = {}  # failure kind -> its message, until an operation succeeds
        self._creation_errors: frozenset[str] = frozenset()  # those already reported
        self._identity_listed_at = float("-inf")
        self.keys = identity.SigningKeys(
            settings.identity_certs, settings.identity_certs_refresh_seconds, wall, self._in_thread
        )
        self.wall = wall

    @property
    def desired(self) -> int:
        """The group's size to keep: the operator's floor, raised by the controller's ask up to the ceiling."""
        s = self.settings
        wanted = instances_for(self.wanted_slots, s.slots_per_instance)
        return backoffs.desired_capacity(s.target_capacity, s.max_capacity, wanted)

    @property
    def group(self) -> str:
        return self.settings.instance_group

    # -- the Provider protocol

    async def list_instances(self) -> frozenset[str]:
        if not self.backoff.may_read(self.clock.now()):  # rate limited: not even a read before then
            raise ProviderUnavailable(f"throttled until {self.backoff.throttled_until:.0f}")
        listed = await self._relist()
        self._report_creation_errors(listed)
        await self._maintain(listed)
        return frozenset(i.name for i in listed if i.alive)

    async def request_capacity(self, slots: int) -> None:
        """Aim the group at the controller's level (within target and max); the next poll resizes it."""
        self.wanted_slots = slots
        wanted = instances_for(slots, self.settings.slots_per_instance)
        if wanted > self.desired:
            message = f"{wanted} VM(s) wanted, at most {self.desired} (max_capacity)"
            self._event(facts.ProviderCapacityLimited(self.group, message, wanted, self.desired))

    async def release(self, name: str, *, force: bool = False) -> None:
        """Delete the instance of a node the controller gave up on (GONE, LOST): never a busy one."""
        busy = self.port.busy(name)
        if not backoffs.may_delete(busy, delete_busy=self.settings.delete_busy_nodes, force=force):
            self._event(facts.ProviderReleaseRefused(self.group, "the node runs a job; operator override needed", name))
            return
        instance = self.instances.get(name)
        if instance is None or instance.leaving:
            return  # not (or no longer) in the group
        await self._run(f"release:{name}", self._delete([instance], f"release {name}"))

    async def close(self) -> None:
        for task in list(self.pending.values()):
            task.cancel()
        await asyncio.gather(*self.pending.values(), return_exceptions=True)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.groups.transport.close()  # type: ignore[no-untyped-call]
        self.operations.transport.close()  # type: ignore[no-untyped-call]

    def status(self) -> dict[str, Any]:
        now = self.clock.now()
        return {
            "instance_group": self.group,
            "target_capacity": self.settings.target_capacity,
            "desired_capacity": self.desired,
            "instances": sum(1 for i in self.instances.values() if i.alive),
            "pending": sorted(self.pending),
            "backoff_until": self.backoff.not_before if now < self.backoff.not_before else None,
            "throttled_until": self.backoff.throttled_until if now < self.backoff.throttled_until else None,
        }

    # -- identity (controller.providers.identity.IdentityVerifier)

    async def verify_identity(self, document: str) -> str:
        """The instance name a signed identity token proves, if it names an instance of this group."""
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

        try:
            listed = await self._call(fetch)
        except Exception as exc:  # every API error is an event, never an exception out of a timer
            self._failed("list", exc)
            raise ProviderUnavailable(short(exc)) from None
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
            await self._run(scale.CLEAN, self._delete(list(plan.clean), "remove stopped instances"))
        if plan.resize is not None:
            alive = sum(1 for i in listed if i.alive)
            await self._run(scale.SCALE, self._resize(plan.resize, alive))
        if plan.deferred:
            message = f"{plan.deferred} instance(s) above the desired {desired} run jobs"
            self._event(facts.ProviderScaleInDeferred(self.group, message))
        if plan.scale_in:
            await self._run(scale.SCALE, self._delete(list(plan.scale_in), f"scale in to {desired}"))

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
        self._event(facts.ProviderScaleOut(self.group, f"targetSize {current} -> {wanted} ({alive} alive)", wanted))
        operation = await self._call(
            lambda: self.groups.resize_unary(
                project=project, zone=zone, instance_group_manager=name, size=wanted, retry=None, timeout=timeout
            )
        )
        await self._wait(operation)
        self._event(facts.ProviderScaleOutDone(self.group, f"targetSize {wanted}", wanted))

    async def _delete(self, instances: list[Managed], why: str) -> None:
        s = self.settings
        names = sorted(i.name for i in instances)
        self._event(facts.ProviderDeleteInstances(self.group, f"{why}: {', '.join(names)}", names))
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
            await self.sleep(s.operation_poll_seconds)
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
        attempt = 0
        while True:
            try:
                async with asyncio.timeout(2 * s.request_timeout_seconds):  # not wait_for: it may swallow a cancel
                    return await self._in_thread(call)
            except Exception as exc:
                wait = retry_wait(exc, attempt, s.retry_seconds)
                if wait is None or attempt >= s.retries:
                    raise
                log.info("retrying in %g s: %s", wait, short(exc))
                await self.sleep(wait)
                attempt += 1

    def _in_thread(self, call: Callable[[], T]) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(call))

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
                self.backoff = backoffs.after_success(self.backoff)
                self._failing.clear()
            finally:
                self.pending.pop(key, None)

        self.pending[key] = asyncio.ensure_future(guarded())
        await asyncio.sleep(0)  # let it send its first request now

    def _report_creation_errors(self, listed: list[Managed]) -> None:
        """Why the group cannot create instances (it keeps trying itself): one event per new reason."""
        found = scale.creation_errors(listed)
        for text, (capacity, message) in found.items():
            if text not in self._creation_errors:
                fact = facts.ProviderCapacityUnavailable if capacity else facts.ProviderError
                self._event(fact(self.group, f"creating instances: {message}", "create", None))
        self._creation_errors = frozenset(found)

    def _failed(self, what: str, exc: BaseException) -> None:
        failure = describe(exc)
        now = self.clock.now()
        s = self.settings
        self.backoff = backoffs.after_failure(self.backoff, failure, now, s.backoff_seconds, s.max_backoff_seconds)
        if self._failing.get(failure.kind) == failure.message:
            log.warning("%s (again): %s", failure.kind, failure.message)
            return  # the same failure on every poll is one event, not one a poll
        self._failing[failure.kind] = failure.message
        fact = facts.CALL_FAILURES[failure.kind]
        self._event(fact(self.group, failure.message, what, self.backoff.retry_at(now)))

    def _event(self, fact: facts.ScaleSetFact) -> None:
        log.log(logging.INFO if fact.kind in INFO_EVENTS else logging.WARN, "%s: %s", fact.kind, fact.message)
        self.port.report(fact)


def _managed(m: compute_v1.ManagedInstance) -> Managed:
    """One listed instance; its name from ``name``, else the last part of its ``instance`` URL."""
    name = m.name or m.instance.rsplit("/", 1)[-1]
    errors: tuple[tuple[str, str], ...] = ()
    if m.last_attempt and m.last_attempt.errors:
        errors = tuple((e.code, short(e.message)) for e in list(m.last_attempt.errors.errors)[:5])
    return Managed(name, str(m.id) if m.id else "", m.instance_status, m.current_action or "NONE", errors)
