"""The AWS provider: an EC2 Auto Scaling group of Spot instances (boto3), made by the operator's CloudFormation.

The group (deploy/aws/template.yaml: a mixed instances policy of several GPU types, Spot only,
price-capacity-optimized, capacity rebalance on, new instances protected from scale-in) keeps its desired
capacity by itself, replacing interrupted instances; the provider moves that capacity and watches:

- every poll is one DescribeAutoScalingGroups call. Instances are matched to agents by instance id (the agent's
  user data takes it from the instance metadata as its node name and instance id); instances terminating,
  terminated or detached are not listed, so their nodes become GONE even when no agent reported a notice;
- the desired capacity follows the controller's level (slots / ``slots_per_instance``, within ``min_capacity``
  and ``max_capacity`` and the group's MinSize/MaxSize): raised with SetDesiredCapacity; lowered by terminating
  idle instances with TerminateInstanceInAutoScalingGroup (decrementing it), never one whose node runs a job
  unless the operator allows it. What to do is decided by :mod:`controller.providers.aws_scale`;
- each instance in service is handed its own agent token (:mod:`controller.providers.aws_tokens`: two SSM Run
  Commands, the token sealed to a key the instance made), so a registration proves its instance;
- failed launches (no Spot capacity in any pool, quota) are read from the group's scaling activities;
- boto3 is synchronous: its calls run on a small thread pool of the provider's own (so ``close`` never waits for
  a call stuck until its timeout), each under ``call_timeout_seconds``. Throttled, timed-out and 5xx calls are
  retried ``retries`` times with a doubling, jittered wait; still throttled, no call is made for
  ``throttle_seconds``. Every error becomes one event, never an exception out of a timer; an unreachable API
  makes ``list_instances`` raise :class:`CannotList`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions as aws_errors  # type: ignore[import-untyped]

from controller.core.events import EventKind
from controller.eventlog import provider_facts as facts
from controller.providers import aws_scale as scale
from controller.providers import aws_tokens
from controller.providers.aws_config import AwsSettings
from controller.providers.aws_failures import GroupNotFound, describe, retryable, short, throttled
from controller.providers.aws_scale import Group, Instance, MalformedResponse
from controller.providers.azure_scale import Backoff, after_failure, after_success, may_delete
from controller.providers.base import CannotList, Clock, ProviderPort, SilentPort, instances_for

log = logging.getLogger("spotmorph.controller.aws")

K = EventKind
SERVICES = ("autoscaling", "ssm")
INFO_EVENTS = frozenset({K.PROVIDER_SCALE_OUT, K.PROVIDER_SCALE_OUT_DONE, K.PROVIDER_DELETE_INSTANCES})
INFO_EVENTS |= {K.PROVIDER_AGENT_TOKEN_DELIVERED}
ACTIVITIES = "activities"  # the key of the background look at failed launches
MAX_HAND_OVERS = 8  # token hand-overs under way at once: each polls SSM, whose API rate is limited


class ProviderUnavailable(CannotList):
    """No instance list this time (AWS unreachable, throttled, the group missing): the runner skips the poll."""


class AwsAutoScalingProvider:
    """The Provider protocol over one Auto Scaling group of Spot instances; see the module docstring."""

    def __init__(
        self,
        settings: AwsSettings,
        clock: Clock,
        port: ProviderPort | None = None,
        *,
        vm_token: Callable[[str], str] | None = None,
        session: Any | None = None,  # tests: a boto3 Session with fixed credentials
        sleep: Callable[[float], Awaitable[None]] | None = None,  # tests: the waits between retries, recorded
    ) -> None:
        """``vm_token``: the agent token of an instance by id (controller.tokens); None hands out none."""
        s = self.settings = settings
        self.clock = clock
        self.port: ProviderPort = port or SilentPort()
        self.session = session
        self.clients: dict[str, Any] = {}  # made on the pool at the first call: credentials may need the network
        self._clients_lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="spotmorph-aws")
        self.sleep = sleep or asyncio.sleep
        self.group: Group | None = None  # the last describe
        self.instances: dict[str, Instance] = {}  # ... its instances by id
        self.wanted_slots = 0  # the controller's last request_capacity
        self.backoff = Backoff()
        self.pending: dict[str, asyncio.Task[None]] = {}  # "scale", "activities", "release:ID", "token:ID"
        self._failing: dict[tuple[str, str], str] = {}  # (operation, failure kind) -> its message, until it succeeds
        self._said: dict[str, object] = {}  # what was last said of the capacity ceiling and deferred scale-in
        self.activities_seen: set[str] | None = None  # None: not looked yet (old failures are not news)
        self.vm_token = vm_token if s.agent_tokens else None
        self.tokens_delivered: set[str] = set()  # instances handed their token (again after a controller restart)
        self.token_retry_at: dict[str, float] = {}  # instance -> when its failed hand-over is tried again
        self.closed = False

    @property
    def desired(self) -> int | None:
        """The group's desired capacity the provider aims for (None before the first describe)."""
        if self.group is None:
            return None
        wanted = instances_for(self.wanted_slots, self.settings.slots_per_instance)
        return scale.desired_capacity(self.settings.min_capacity, self.settings.max_capacity, self.group, wanted)

    # -- the Provider protocol

    async def list_instances(self) -> frozenset[str]:
        if self.closed:
            raise ProviderUnavailable("the provider is closed")
        if not self.backoff.may_read(self.clock.now()):  # still throttled: not even a read before then
            raise ProviderUnavailable(f"throttled until {self.backoff.throttled_until:.0f}")
        try:
            group = await self._describe()
        except Exception as exc:  # every AWS error is an event, never an exception out of a timer
            self._failed("list", exc)
            raise ProviderUnavailable(short(exc)) from None
        self._succeeded("list")
        self.group, self.instances = group, {i.id: i for i in group.instances}
        await self._maintain(group)
        return frozenset(i.id for i in group.alive)

    async def request_capacity(self, slots: int) -> None:
        """Aim the group at the controller's level (within the capacities); the next poll scales it."""
        self.wanted_slots = slots
        if self.group is not None:
            self._say_limit(self.group)

    async def release(self, name: str, *, force: bool = False) -> None:
        """Terminate the instance of a node the controller gave up on (GONE, LOST) — never a busy one."""
        if not may_delete(self.port.busy(name), delete_busy=self.settings.delete_busy_nodes, force=force):
            why = "the node runs a job; operator override needed"
            self._event(facts.ProviderReleaseRefused(self.name, why, name))
            return
        instance = self.instances.get(name)
        if instance is None or not instance.alive or f"release:{name}" in self.pending:
            return  # not (or no longer) in the group, or on its way out
        await self._run(f"release:{name}", self._terminate([instance], f"release {name}"))

    async def close(self) -> None:
        self.closed = True
        for task in list(self.pending.values()):
            task.cancel()
        await asyncio.gather(*self.pending.values(), return_exceptions=True)
        self.executor.shutdown(wait=False, cancel_futures=True)  # a call under way ends by its own timeout
        with self._clients_lock:
            for client in self.clients.values():
                client.close()

    def status(self) -> dict[str, Any]:
        now = self.clock.now()
        return {
            "auto_scaling_group": self.name,
            "desired_capacity": self.desired,
            "instances": len(self.group.alive) if self.group else None,
            "pending": sorted(self.pending),
            "backoff_until": self.backoff.not_before if now < self.backoff.not_before else None,
            "throttled_until": self.backoff.throttled_until if now < self.backoff.throttled_until else None,
        }

    # -- AWS calls

    async def call(self, service: str, operation: str, arguments: dict[str, Any], idempotent: bool = True) -> Any:
        """One AWS call off the event loop, under the timeout, retried while transient; its answer.

        A call that is not ``idempotent`` (SendCommand) is retried only when throttled (it did not run): after a
        timeout or a lost connection it may have run, and running it twice is not the same as once."""
        s = self.settings
        work = functools.partial(self._invoke, service, operation, arguments)
        for attempt in range(s.retries + 1):
            future = asyncio.get_running_loop().run_in_executor(self.executor, work)
            try:
                return await asyncio.wait_for(future, 2 * s.call_timeout_seconds + 1)
            except Exception as exc:
                if attempt == s.retries or not retryable(exc) or not (idempotent or throttled(exc)):
                    raise
                log.info("%s %s: %s, try %d of %d", service, operation, short(exc), attempt + 2, s.retries + 1)
            await self.sleep(s.retry_base_seconds * 2**attempt * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def _invoke(self, service: str, operation: str, arguments: dict[str, Any]) -> Any:
        """On the pool: the call itself, its client made first if need be (finding credentials may take the
        instance metadata service a second: never on the event loop)."""
        with self._clients_lock:
            if not self.clients:
                s = self.settings
                session = self.session or boto3.session.Session(profile_name=s.profile, region_name=s.region)
                config = botocore.config.Config(
                    region_name=s.region,
                    connect_timeout=s.call_timeout_seconds,
                    read_timeout=s.call_timeout_seconds,
                    retries={"total_max_attempts": 1},  # the provider retries itself, with its backoff and events
                    user_agent_extra="spotmorph",
                )
                self.clients = {
                    name: session.client(name, endpoint_url=s.endpoint_url, config=config) for name in SERVICES
                }
            client = self.clients[service]
        try:
            return getattr(client, operation)(**arguments)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:  # botocore's parser, lost
            raise MalformedResponse(f"an answer that is not AWS's to {operation}: {type(exc).__name__} {exc}") from exc

    async def _describe(self) -> Group:
        answer = await self.call("autoscaling", "describe_auto_scaling_groups", {"AutoScalingGroupNames": [self.name]})
        group = scale.parse_group(answer, self.name)
        if group is None:
            raise GroupNotFound(f"no Auto Scaling group {self.name} in {self.settings.region}")
        return group

    async def _maintain(self, group: Group) -> None:
        """Start what the plan says (scale out or in), look at failed launches, hand out tokens: in the background."""
        desired = self.desired
        assert desired is not None
        self._say_limit(group)
        busy = frozenset(i.id for i in group.alive if self.port.busy(i.id))
        plan = scale.plan_scale(
            group,
            desired,
            busy,
            delete_busy=self.settings.delete_busy_nodes,
            pending=self.pending.keys(),
            now=self.clock.now(),
            backoff=self.backoff,
        )
        if plan.set_desired is not None or plan.terminate:
            await self._run(scale.SCALE, self._scale(plan, group, desired))
        if plan.deferred != self._said.get("deferred", 0):
            self._said["deferred"] = plan.deferred
            if plan.deferred:
                message = f"{plan.deferred} instance(s) above the desired {desired} run jobs"
                self._event(facts.ProviderScaleInDeferred(self.name, message))
        if len(group.alive) < max(group.desired, desired) and ACTIVITIES not in self.pending:
            await self._run(ACTIVITIES, self._look_at_launches(), counts=False)
        if self.vm_token is not None:
            self.tokens_delivered &= set(self.instances)  # bounded: ids of instances gone are never reused
            now, delivered = self.clock.now(), self.tokens_delivered
            needing = scale.needing_token(group.alive, delivered, self.token_retry_at, self.pending, now)
            under_way = sum(1 for key in self.pending if key.startswith(f"{scale.TOKEN_TASK}:"))
            for instance in needing[: max(0, MAX_HAND_OVERS - under_way)]:  # the rest at the next polls
                key = f"{scale.TOKEN_TASK}:{instance.id}"
                self.pending[key] = asyncio.ensure_future(self._hand_token(key, instance, self.vm_token))

    def _say_limit(self, group: Group) -> None:
        """ProviderCapacityLimited, once for each level above the ceiling."""
        wanted = instances_for(self.wanted_slots, self.settings.slots_per_instance)
        ceiling = scale.ceiling(self.settings.max_capacity, group)
        limited = (wanted, ceiling) if wanted > ceiling else None
        if limited is not None and self._said.get("limit") != limited:
            message = f"{wanted} instance(s) wanted, at most {ceiling} (max_capacity, the group's MaxSize)"
            self._event(facts.ProviderCapacityLimited(self.name, message, wanted, ceiling))
        self._said["limit"] = limited

    async def _scale(self, plan: scale.ScalePlan, group: Group, desired: int) -> None:
        if plan.set_desired is not None:
            up = plan.set_desired > group.desired
            message = f"desired capacity {group.desired} -> {plan.set_desired} ({len(group.alive)} instance(s))"
            if up:
                self._event(facts.ProviderScaleOut(self.name, message, plan.set_desired))
            arguments = {"AutoScalingGroupName": self.name, "DesiredCapacity": plan.set_desired, "HonorCooldown": False}
            await self.call("autoscaling", "set_desired_capacity", arguments)
            if up:
                done = f"desired capacity {plan.set_desired}"
                self._event(facts.ProviderScaleOutDone(self.name, done, plan.set_desired))
        if plan.terminate:
            await self._terminate(list(plan.terminate), f"scale in to {desired}")

    async def _terminate(self, instances: list[Instance], why: str) -> None:
        """Each instance terminated, the desired capacity decremented with it (not below MinSize: then replaced)."""
        names = sorted(i.id for i in instances)
        self._event(facts.ProviderDeleteInstances(self.name, f"{why}: {', '.join(names)}", names))
        for instance in instances:
            arguments = {"InstanceId": instance.id, "ShouldDecrementDesiredCapacity": True}
            try:
                await self.call("autoscaling", "terminate_instance_in_auto_scaling_group", arguments)
            except aws_errors.ClientError as exc:
                said = short(exc).lower()
                if "min size" in said:  # at the group's floor: terminated all the same, and replaced
                    arguments["ShouldDecrementDesiredCapacity"] = False
                    await self.call("autoscaling", "terminate_instance_in_auto_scaling_group", arguments)
                elif "not found" not in said and "terminat" not in said:
                    raise  # else already gone, or on its way out: what we wanted

    async def _look_at_launches(self) -> None:
        """The group's failed launches since the last look, each said once (it retries them itself)."""
        arguments = {"AutoScalingGroupName": self.name, "MaxRecords": 20}
        answer = await self.call("autoscaling", "describe_scaling_activities", arguments)
        first, seen = self.activities_seen is None, self.activities_seen or set()
        for activity_id, message in scale.launch_failures(answer, seen):
            seen.add(activity_id)
            if first:
                continue  # what failed before this controller looked is no news
            fact = facts.CALL_FAILURES[scale.launch_failure_kind(message)]
            self._event(fact(self.name, f"launch failed: {message}", "launch", None))
        self.activities_seen = set(list(seen)[-1000:])

    async def _hand_token(self, key: str, instance: Instance, vm_token: Callable[[str], str]) -> None:
        """Write ``instance``'s own agent token to its /etc/spotmorph/agent.token (aws_tokens).

        A failure is this instance's alone: an event, and another try after ``token_retry_seconds``, while the
        group's backoff is left as it is."""
        try:
            await aws_tokens.hand_over(self.call, self.settings, instance.id, vm_token(instance.id))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry_at = self.clock.now() + self.settings.token_retry_seconds
            self.token_retry_at[instance.id] = retry_at
            message = f"{instance.id}: {describe(exc).message}"
            self._event(facts.ProviderAgentTokenFailed(self.name, message, instance.id, retry_at))
        else:
            self.tokens_delivered.add(instance.id)
            self.token_retry_at.pop(instance.id, None)
            self._event(facts.ProviderAgentTokenDelivered(self.name, instance.id, instance.id))
        finally:
            self.pending.pop(key, None)

    async def _run(self, key: str, work: Coroutine[Any, Any, None], counts: bool = True) -> None:
        """Start ``work`` in the background; its outcome resets or extends the backoff (``counts``)."""

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(key.split(":")[0], exc)
            else:
                self._succeeded(key.split(":")[0])
                if counts:
                    self.backoff = after_success(self.backoff)
            finally:
                self.pending.pop(key, None)

        self.pending[key] = asyncio.ensure_future(guarded())
        await asyncio.sleep(0)  # let it send its first request now

    def _failed(self, what: str, exc: BaseException) -> None:
        s = self.settings
        failure = describe(exc, s.throttle_seconds)
        now = self.clock.now()
        self.backoff = after_failure(self.backoff, failure, now, s.backoff_seconds, s.max_backoff_seconds)
        if self._failing.get((what, failure.kind)) == failure.message:
            log.warning("%s (again): %s", failure.kind, failure.message)
            return  # the same failure on every poll is one event, not one a poll
        self._failing[(what, failure.kind)] = failure.message
        fact = facts.CALL_FAILURES[failure.kind]
        self._event(fact(self.name, failure.message, what, self.backoff.retry_at(now)))

    def _succeeded(self, what: str) -> None:
        """``what`` went through: its next failure is news again (another operation's is not)."""
        self._failing = {key: message for key, message in self._failing.items() if key[0] != what}

    @property
    def name(self) -> str:
        return self.settings.auto_scaling_group

    def _event(self, fact: facts.ScaleSetFact) -> None:
        log.log(logging.INFO if fact.kind in INFO_EVENTS else logging.WARN, "%s: %s", fact.kind, fact.message)
        self.port.report(fact)
