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
from collections.abc import Awaitable, Callable
from typing import Any

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions as aws_errors  # type: ignore[import-untyped]

from controller.eventlog import provider_facts as facts
from controller.providers import aws_scale as scale
from controller.providers import aws_tokens, scaling
from controller.providers.aws_config import AwsSettings
from controller.providers.aws_failures import GroupNotFound, describe, retryable, short, throttled
from controller.providers.aws_scale import Group, Instance, MalformedResponse
from controller.providers.base import Clock, ProviderPort, SilentPort, instances_for
from controller.providers.operations import FailureMemory, Operations, Threads, TokenHandOvers
from controller.providers.operations import ProviderUnavailable as ProviderUnavailable  # the runner skips the poll
from controller.providers.pools import PooledGroups
from controller.providers.scaling import Backoff

log = logging.getLogger("spotmorph.controller.aws")

SERVICES = ("autoscaling", "ssm")
ACTIVITIES = "activities"  # the key of the background look at failed launches
MAX_HAND_OVERS = 8  # token hand-overs under way at once: each polls SSM, whose API rate is limited


class AwsAutoScalingProvider(PooledGroups):
    """The Provider protocol over an Auto Scaling group of Spot instances, and one of On-Demand instances for
    on-demand capacity where configured (a provider of this class over it, :mod:`controller.providers.pools`);
    see the module docstring."""

    on_demand_setting = "aws.on_demand_auto_scaling_group (an Auto Scaling group of On-Demand instances: docs/aws.md)"

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
        self.threads = Threads(4, "spotmorph-aws", sleep or asyncio.sleep, log)
        self.group: Group | None = None  # the last describe
        self.instances: dict[str, Instance] = {}  # ... its instances by id
        self.wanted_slots = 0  # the controller's last request_capacity
        self.ops = Operations(
            s.auto_scaling_group,
            clock,
            self.port,
            functools.partial(describe, throttle_seconds=s.throttle_seconds),
            (s.backoff_seconds, s.max_backoff_seconds),
            log,
            FailureMemory.UNTIL_IT_SUCCEEDS,
        )
        self.pending = self.ops.pending  # "scale", "activities", "release:ID", "token:ID"
        self._said: dict[str, object] = {}  # what was last said of the capacity ceiling and deferred scale-in
        self.activities_seen: set[str] | None = None  # None: not looked yet (old failures are not news)
        self.tokens: TokenHandOvers | None = None  # None: no agent tokens handed out
        if vm_token is not None and s.agent_tokens:
            self.tokens = TokenHandOvers(self.ops, vm_token, s.token_retry_seconds)
        self.closed = False
        on_demand = s.on_demand()
        if on_demand is not None:  # its own clients, threads and operations
            self.on_demand = AwsAutoScalingProvider(
                on_demand, clock, self.port, vm_token=vm_token, session=session, sleep=sleep
            )

    @property
    def backoff(self) -> Backoff:
        return self.ops.backoff

    @property
    def desired(self) -> int | None:
        """The group's desired capacity the provider aims for (None before the first describe)."""
        if self.group is None:
            return None
        wanted = instances_for(self.wanted_slots, self.settings.slots_per_instance)
        return scale.desired_capacity(self.settings.min_capacity, self.settings.max_capacity, self.group, wanted)

    # -- the Provider protocol

    async def list_group(self) -> frozenset[str]:
        if self.closed:
            raise ProviderUnavailable("the provider is closed")
        self.ops.check_readable()  # still throttled: not even a read before then
        group = await self.ops.read(self._describe(), short)
        self.group, self.instances = group, {i.id: i for i in group.instances}
        await self._maintain(group)
        return frozenset(i.id for i in group.alive)

    async def request_group(self, slots: int) -> None:
        """Aim the group at the controller's level (within the capacities); the next poll scales it."""
        self.wanted_slots = slots
        if self.group is not None:
            self._say_limit(self.group)

    async def release_group(self, name: str, *, force: bool = False) -> None:
        """Terminate the instance of a node the controller gave up on (GONE, LOST) — never a busy one."""
        if not self.ops.may_release(name, delete_busy=self.settings.delete_busy_nodes, force=force):
            return
        instance = self.instances.get(name)
        if instance is None or not instance.alive or f"release:{name}" in self.pending:
            return  # not (or no longer) in the group, or on its way out
        await self.ops.run(f"release:{name}", self._terminate([instance], f"release {name}"))

    async def close_group(self) -> None:
        self.closed = True
        await self.ops.close()
        self.threads.shutdown()
        with self._clients_lock:
            for client in self.clients.values():
                client.close()

    def status(self) -> dict[str, Any]:
        return {
            "auto_scaling_group": self.name,
            "desired_capacity": self.desired,
            "instances": len(self.group.alive) if self.group else None,
            **self.ops.status(),
            **({"on_demand": self.on_demand.status()} if isinstance(self.on_demand, AwsAutoScalingProvider) else {}),
        }

    # -- AWS calls

    async def call(self, service: str, operation: str, arguments: dict[str, Any], idempotent: bool = True) -> Any:
        """One AWS call off the event loop, under the timeout, retried while transient; its answer.

        A call that is not ``idempotent`` (SendCommand) is retried only when throttled (it did not run): after a
        timeout or a lost connection it may have run, and running it twice is not the same as once."""
        s = self.settings
        work = functools.partial(self._invoke, service, operation, arguments)

        def wait(exc: Exception, attempt: int) -> float | None:
            if not retryable(exc) or not (idempotent or throttled(exc)):
                return None
            return s.retry_base_seconds * 2.0**attempt * (0.5 + random.random() / 2)

        return await self.threads.retried(work, 2 * s.call_timeout_seconds + 1, s.retries, wait)

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
            await self.ops.run(scaling.SCALE, self._scale(plan, group, desired))
        if plan.deferred != self._said.get("deferred", 0):
            self._said["deferred"] = plan.deferred
            if plan.deferred:
                message = f"{plan.deferred} instance(s) above the desired {desired} run jobs"
                self.ops.event(facts.ProviderScaleInDeferred(self.name, message))
        if len(group.alive) < max(group.desired, desired) and ACTIVITIES not in self.pending:
            await self.ops.run(ACTIVITIES, self._look_at_launches(), counts=False)
        if self.tokens is not None:
            tokens = self.tokens
            tokens.keep_only(set(self.instances))  # bounded: ids of instances gone are never reused
            needing = tokens.needing(group.alive, lambda i: i.id)
            for instance in needing[: max(0, MAX_HAND_OVERS - tokens.under_way())]:  # the rest at the next polls
                tokens.start(instance.id, functools.partial(self._hand_token, instance.id), self._say)

    async def _hand_token(self, instance_id: str, token: str) -> None:
        """Write the instance's own agent token to its /etc/spotmorph/agent.token (aws_tokens)."""
        await aws_tokens.hand_over(self.call, self.settings, instance_id, token)

    def _say(self, exc: BaseException) -> str:
        return describe(exc, self.settings.throttle_seconds).message

    def _say_limit(self, group: Group) -> None:
        """ProviderCapacityLimited, once for each level above the ceiling."""
        wanted = instances_for(self.wanted_slots, self.settings.slots_per_instance)
        ceiling = scale.ceiling(self.settings.max_capacity, group)
        limited = (wanted, ceiling) if wanted > ceiling else None
        if limited is not None and self._said.get("limit") != limited:
            message = f"{wanted} instance(s) wanted, at most {ceiling} (max_capacity, the group's MaxSize)"
            self.ops.event(facts.ProviderCapacityLimited(self.name, message, wanted, ceiling))
        self._said["limit"] = limited

    async def _scale(self, plan: scale.ScalePlan, group: Group, desired: int) -> None:
        if plan.set_desired is not None:
            up = plan.set_desired > group.desired
            message = f"desired capacity {group.desired} -> {plan.set_desired} ({len(group.alive)} instance(s))"
            if up:
                self.ops.event(facts.ProviderScaleOut(self.name, message, plan.set_desired))
            arguments = {"AutoScalingGroupName": self.name, "DesiredCapacity": plan.set_desired, "HonorCooldown": False}
            await self.call("autoscaling", "set_desired_capacity", arguments)
            if up:
                done = f"desired capacity {plan.set_desired}"
                self.ops.event(facts.ProviderScaleOutDone(self.name, done, plan.set_desired))
        if plan.terminate:
            await self._terminate(list(plan.terminate), f"scale in to {desired}")

    async def _terminate(self, instances: list[Instance], why: str) -> None:
        """Each instance terminated, the desired capacity decremented with it (not below MinSize: then replaced)."""
        names = sorted(i.id for i in instances)
        self.ops.event(facts.ProviderDeleteInstances(self.name, f"{why}: {', '.join(names)}", names))
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
            self.ops.event(fact(self.name, f"launch failed: {message}", "launch", None))
        self.activities_seen = set(list(seen)[-1000:])

    @property
    def name(self) -> str:
        return self.settings.auto_scaling_group
