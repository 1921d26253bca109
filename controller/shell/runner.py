"""The thin shell around the pure core: persist the commands first, then act on them.

One asyncio lock serialises decisions. Heartbeats that change nothing but the time and the step only
update the in-memory observation (no database write); anything else (a trainer started or exited, a
checkpoint, a notice) runs reconcile at once. A 1 s tick picks up step progress and expiries.

A decision is the request's own commands (a registration, a submission), the provider's events and
reconcile's commands, persisted in one transaction: a request whose decision fails leaves nothing
behind. A failure is contained (:meth:`Runner._contain`): observations that arrived since the last
decision are set aside and readmitted half by half, and the ones a decision still fails with are
refused, so one node's report never stops decisions for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import assert_never

from controller.core import capacity, intake, invariants
from controller.core import stimulus as stimuli
from controller.core.model import (
    Action,
    AddJob,
    Command,
    ForgetNode,
    JobRecord,
    NodeObservation,
    NodeRecord,
    RecordCheckpoint,
    RecordEvent,
    RecordPause,
    ReleaseInstance,
    RequestCapacity,
    SetJob,
    SetNode,
    SetNodeSeq,
    SetPoolStats,
    StartGeneration,
    World,
    apply,
)
from controller.core.reconcile import Config, cancel, reconcile
from controller.core.stimulus import Stimulus
from controller.eventlog import facts, provider_facts
from controller.persistence.store import Deposed, Store
from controller.providers.base import CannotList, Clock, Provider, ProviderEvent, ProviderInbox
from controller.shell import effects
from controller.shell.containment import Containment
from controller.shell.effects import Effects
from controller.shell.failures import DecisionsFailed, HealthPort, Refused, describe
from controller.shell.planning import MemoPlanner, Planners
from morphing.jobspec import JobSpec
from scheduler.pools import PoolKind

__all__ = ["MemoPlanner", "Runner", "RunnerSettings", "SystemClock"]

log = logging.getLogger("spotmorph.controller")


class SystemClock:
    def now(self) -> float:
        return time.time()


@dataclass(frozen=True)
class RunnerSettings:
    coalesce_seconds: float = 0.005  # how long the first of a burst of state changes waits for others
    capacity_retry_seconds: float = 30.0  # a refused capacity request is asked again after this
    validate: bool = False  # check controller.core.invariants on every decided world before committing it


class Runner(Containment):
    """Decides under one lock, persists, then performs side effects whose outcomes come back as events.

    ``inbox`` is the port the provider was built with (a fresh one when the provider reports nothing);
    ``health`` is told when decisions start failing and when they work again.
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        config: Config,
        provider: Provider,
        inbox: ProviderInbox | None = None,
        settings: RunnerSettings | None = None,
        health: HealthPort | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.provider = provider
        self.inbox = inbox or ProviderInbox(clock)
        self.settings = settings or RunnerSettings()
        self.health = health
        self.deposed: Callable[[], None] = lambda: None  # told when a write found another controller leading
        self.nodes: dict[str, NodeRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.observed: dict[str, NodeObservation] = {}
        self.reload()
        self.lock = asyncio.Lock()
        self.changed = asyncio.Event()  # set after every commit: wakes event followers
        self.planner = Planners()
        self.effects = Effects()  # provider calls under way
        self.reconciles = 0
        self.coalesce_seconds = self.settings.coalesce_seconds
        self.capacity_ask: capacity.CapacityAsk | None = None  # the last spot level asked of the provider
        self.on_demand_ask: capacity.CapacityAsk | None = None  # ... and the last on-demand level
        self.inbox.publish_busy(capacity.busy_nodes(self.nodes))
        self._wanted = 0  # observations that asked for a reconcile, counted
        self._decided = 0  # the newest of those that a finished reconcile included
        self.deciding = True  # False while decisions fail (the health service says NOT_SERVING)
        self._undelivered: list[ProviderEvent] = []  # drained from the inbox, not yet in the log
        self._fresh: set[str] = set()  # nodes whose observation changed since the last decision
        self._accepted: dict[str, NodeObservation] = {}  # their observations as that decision saw them
        self._refused: dict[str, tuple[NodeObservation, str]] = {}  # observations set aside, and why

    def reload(self) -> None:
        """What the store holds, as a controller starting (or taking the lease) sees it: every node gets a heartbeat
        expiry from now to be heard from. A standby calls it to answer reads with what the leader committed."""
        self.nodes, self.jobs = self.store.load()
        self.job_seq, self.node_seq, self.incarnation_floor = self.store.counters()
        self.pools = self.store.pools()
        self.started_at = self.clock.now()
        self.observed = {}

    async def refresh(self) -> None:
        """A standby's reload (off the event loop), then a wake for the readers that follow the state."""
        nodes, jobs = await asyncio.to_thread(self.store.load)
        self.nodes, self.jobs = nodes, jobs
        self.changed.set()
        self.changed = asyncio.Event()

    @property
    def world(self) -> World:
        counters = (self.job_seq, self.node_seq, self.incarnation_floor)
        return World(self.nodes, self.jobs, self.observed, self.started_at, *counters, self.pools)

    def commit(self, commands: list[Command], stimulus: Stimulus) -> None:
        """Persist (with what triggered the decision), then update the mirror, then act: a crash in between
        loses nothing decided."""
        if not commands:
            return
        self.store.persist(commands, stimulus)
        world = apply(self.world, commands)
        self.nodes, self.jobs, self.observed = dict(world.nodes), dict(world.jobs), dict(world.observed)
        self.job_seq, self.node_seq, self.incarnation_floor = world.job_seq, world.node_seq, world.incarnation_floor
        self.pools = dict(world.pools)
        if any(isinstance(command, SetNode) for command in commands):
            self.inbox.publish_busy(capacity.busy_nodes(self.nodes))
        for command in commands:
            self._act(command)
        self.changed.set()
        self.changed = asyncio.Event()

    def _act(self, command: Command) -> None:
        """A persisted command's side effect; a new command type must say here whether it has one."""
        match command:
            case ReleaseInstance():
                self.effects.spawn(effects.release(self.provider, self.inbox, command.node))
            case RequestCapacity():
                self._set_ask(command.pool, capacity.CapacityAsk(command.slots, self.clock.now()))
                self.effects.spawn(self._request_capacity(command))
            case SetJob(change=change) if change is not None:
                log.info("job %s: %s -> %s (%s)", command.job.id, change.source, change.target, change.reason)
            case SetJob() | SetNode() | AddJob() | SetNodeSeq() | ForgetNode() | StartGeneration() | SetPoolStats():
                pass  # stored, and applied to the world: nothing to do outside
            case RecordCheckpoint() | RecordPause() | RecordEvent():
                pass
            case _:
                assert_never(command)

    async def tick(self, timer: str = stimuli.TICK) -> None:
        async with self.lock:
            self._quietly(lambda: self._reconcile(Stimulus.tick(timer)))

    def _quietly(self, decide: Callable[[], None]) -> None:
        """For timers: a failed decision is logged and shown by health; the next tick tries again."""
        with contextlib.suppress(DecisionsFailed):
            decide()

    def _reconcile(self, stimulus: Stimulus, first: Sequence[Command] = ()) -> None:
        """Decide on ``first`` (a request's own commands) with everything else; contain a failure."""
        try:
            self._decide(stimulus, first)
        except Exception as exc:
            self._contain(stimulus, first, exc)

    def _decide(self, stimulus: Stimulus, first: Sequence[Command]) -> None:
        """``first``, the provider's events and what reconcile makes of them, committed in one transaction."""
        world = apply(self.world, list(first)) if first else self.world
        planners = self.planner.live(world)
        self.reconciles += 1
        included = self._wanted  # every observation recorded so far is seen by this reconcile
        now = self.clock.now()
        self._undelivered += self.inbox.drain()
        commands = [*first, *(RecordEvent(e.kind, e.at, None, None, e.data) for e in self._undelivered)]
        commands += reconcile(world, now, self.config, planners)
        if not self.deciding:  # written even when nothing changed: proves the database takes writes again
            commands.append(facts.DecisionsResumed().recorded(now))
        decided = apply(self.world, commands) if commands else self.world
        if self.settings.validate:
            invariants.check(decided, self.world)  # raises: contained as any failing decision, nothing committed
        retry = self.settings.capacity_retry_seconds
        asks = [capacity.next_ask(decided, now, self._ask(pool), retry, pool) for pool in PoolKind]
        self.commit([*commands, *(ask for ask in asks if ask is not None)], stimulus)
        self._undelivered = []
        self._decided = max(self._decided, included)
        self._accepted.update((name, self.observed[name]) for name in self._fresh if name in self.observed)
        self._fresh.clear()
        self._deciding(True)

    def _ask(self, pool: PoolKind) -> capacity.CapacityAsk | None:
        return self.capacity_ask if pool is PoolKind.SPOT else self.on_demand_ask

    def _set_ask(self, pool: PoolKind, ask: capacity.CapacityAsk) -> None:
        if pool is PoolKind.SPOT:
            self.capacity_ask = ask
        else:
            self.on_demand_ask = ask

    async def _request_capacity(self, command: RequestCapacity) -> None:
        """Ask the provider; the outcome is logged and tells the next decision whether to ask again."""
        outcome = await effects.request_capacity(self.provider, command.slots, command.pool)
        async with self.lock:
            now = self.clock.now()
            last = self._ask(command.pool)
            if last is not None and last.slots == command.slots:
                failed = isinstance(outcome, provider_facts.ProviderCapacityRequestFailed)
                self._set_ask(command.pool, replace(last, at=now, failed=failed))
            try:
                self.commit([outcome.recorded(now)], Stimulus.provider(str(outcome.kind)))
            except Deposed:  # another controller leads: the outcome is its provider's business now
                self.deposed()
            except Exception as exc:  # the database is down: only the record of the outcome is lost, not the effects
                log.warning("recording the capacity request's outcome failed: %s", describe(exc))

    async def decide(self, make: Callable[[World, float], list[Command]], stimulus: Stimulus | None = None) -> None:
        """Run a pure decision on the current world; its commands are committed with the reconcile after it.
        ``stimulus``: the call that asked for it (None: the controller's own, as a tick's)."""
        async with self.lock:
            self._reconcile(stimulus or Stimulus.tick(stimuli.TICK), make(self.world, self.clock.now()))

    async def observe(self, name: str, seen: NodeObservation, rpc: str = "Heartbeat") -> None:
        """Record what a node reports; when it can change a decision, return only after a reconcile saw it.

        Raises :class:`Refused` when deciding on it failed (it is set aside), :class:`DecisionsFailed`
        when no decision can be made now.
        """
        previous = self.observed.get(name)
        self.observed[name] = seen
        self._fresh.add(name)
        node = self.nodes.get(name)
        joining = node is not None and node.state.value == "JOINING"
        holding = any(j.action is Action.HOLD for j in self.jobs.values())  # a salvage's grace and writes are timed
        if joining or holding or intake.essence(previous) != intake.essence(seen):
            await self._reconcile_soon(Stimulus.node_call(rpc, name, seen.incarnation))
        refused = self._refused.pop(name, None)
        if refused is not None and refused[0] is seen:
            raise Refused(f"node {name}: {refused[1]}")

    async def _reconcile_soon(self, stimulus: Stimulus) -> None:
        """Reconcile once for a burst of observations (e.g. 1,000 trainers exiting within a second).

        Every caller recorded its observation before calling. The first caller waits a moment so that
        others arriving meanwhile are recorded too, then runs one reconcile (one transaction) that sees
        them all; a caller whose observation an already finished reconcile saw returns without another.
        Replies still go out only after their observation was decided on and persisted.
        """
        self._wanted += 1
        mine = self._wanted
        await asyncio.sleep(self.coalesce_seconds)
        async with self.lock:
            if self._decided < mine:
                self._reconcile(stimulus)

    async def submit(self, spec: JobSpec, key: str | None = None) -> JobRecord:
        """A new job, stored with the decision on it in one transaction; a retry under ``key`` gets the first."""
        async with self.lock:
            job, commands = intake.submit(self.world, spec, key, self.clock.now())
            if commands:
                self._reconcile(Stimulus.job_call("SubmitJob", job.id, stimuli.OPERATOR), commands)
            return self.jobs[job.id]

    async def cancel(self, job_id: str, who: str) -> JobRecord:
        stimulus = Stimulus.job_call("CancelJob", job_id, stimuli.OPERATOR)
        await self.decide(lambda world, now: cancel(world, job_id, now, who), stimulus)
        return self.jobs[job_id]

    async def poll_provider(self) -> None:
        """Nodes the provider no longer lists are GONE; without a list this time, only its events are logged."""
        try:
            listed: Mapping[str, PoolKind] | None = await self.provider.list_pools()
        except CannotList:
            listed = None
        async with self.lock:
            now = self.clock.now()
            seen = [] if listed is None else intake.provider_listed(self.world, listed, now)
            self._quietly(lambda: self._reconcile(Stimulus.provider("ListInstances"), seen))

    async def request_checkpoints(self, timer: str = stimuli.TICK) -> None:
        async with self.lock:
            asked = intake.request_checkpoints(self.world, self.clock.now())
            self._quietly(lambda: self._reconcile(Stimulus.tick(timer), asked))

    async def settle(self) -> None:
        """Wait for the side effects under way (provider calls) and the outcomes they log."""
        await self.effects.settle()

    async def close(self, decide: bool = True) -> None:
        """Persist the last decisions, finish the side effects under way, close the provider, log its last words.
        ``decide``: False for a standby, which has no decisions to persist (its writes would be refused)."""
        stopping = Stimulus.tick(stimuli.STOP)
        if not decide:
            with contextlib.suppress(Exception):
                await self.provider.close()
            return
        async with self.lock:
            self._quietly(lambda: self._reconcile(stopping))
        with contextlib.suppress(Exception):  # a side effect's bug was logged as it ended the group: stop all the same
            await self.effects.close()
        try:
            await self.provider.close()
        except Exception as exc:
            log.warning("closing the provider failed: %s", exc)
        async with self.lock:
            self._undelivered += self.inbox.drain()
            self.commit([RecordEvent(e.kind, e.at, None, None, e.data) for e in self._undelivered], stopping)
            self._undelivered = []
