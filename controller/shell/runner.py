"""The thin shell around the pure core: persist the commands first, then act on them.

One asyncio lock serialises decisions. Heartbeats that change nothing but the time and the step only
update the in-memory observation (no database write); anything else (a trainer started or exited, a
checkpoint, a notice) runs reconcile at once. A 1 s tick picks up step progress and expiries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.core import capacity
from controller.core import intake as agents
from controller.core.events import EventKind
from controller.core.lifecycle import JobState
from controller.core.model import (
    Command,
    JobRecord,
    NodeObservation,
    NodeRecord,
    RecordEvent,
    ReleaseInstance,
    RequestCapacity,
    SetJob,
    SetNode,
    World,
    apply,
)
from controller.core.reconcile import Config, cancel, reconcile
from controller.persistence.store import Store
from controller.providers.base import CannotList, Clock, Provider, ProviderInbox
from controller.spec import JobSpec, profile_path
from morphing.errors import UserInputError
from morphing.layout import Layout
from morphing.planner import Planner, PlanResult
from morphing.profile import parse_profile

log = logging.getLogger("spotmorph.controller")


class SystemClock:
    def now(self) -> float:
        return time.time()


def _essence(seen: NodeObservation | None) -> object:
    """What in an observation can change a decision (not the time, not the step)."""
    if seen is None:
        return None
    ranks = sorted((r.job, r.generation, r.rank, r.running, r.exit_code, r.last_checkpoint_step) for r in seen.ranks)
    return (seen.incarnation, seen.eviction_not_before, tuple(ranks))


class MemoPlanner(Planner):
    """A planner that remembers its recent answers (planning is a pure function of its inputs).

    Reconcile runs at every state change and every tick, and the growth check asks the same question
    each time (the best plan on the job's nodes plus the free ones): on ~1,000 GPUs that is most of a
    second, so it is answered once per distinct set of nodes, not once per reconcile.
    """

    MAX_REMEMBERED = 32

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plans: dict[tuple[tuple[tuple[str, int], ...], int | None], PlanResult] = {}
        self._evaluated: tuple[Layout, PlanResult] | None = None

    def plan(self, nodes: Sequence[tuple[str, int]], stages: int | None = None) -> PlanResult:
        key = (tuple(nodes), stages)
        found = self._plans.get(key)
        if found is None:
            found = super().plan(nodes, stages)
            if len(self._plans) >= self.MAX_REMEMBERED:
                self._plans.clear()
            self._plans[key] = found
        return found

    def evaluate(self, layout: Layout) -> PlanResult:
        if self._evaluated is None or self._evaluated[0] is not layout:
            self._evaluated = (layout, super().evaluate(layout))
        return self._evaluated[1]


@dataclass(frozen=True)
class RunnerSettings:
    coalesce_seconds: float = 0.005  # how long the first of a burst of state changes waits for others
    capacity_retry_seconds: float = 30.0  # a refused capacity request is asked again after this


class Runner:
    """Decides under one lock, persists, then performs side effects whose outcomes come back as events.

    ``inbox`` is the port the provider was built with (a fresh one when the provider reports nothing).
    """

    def __init__(
        self,
        store: Store,
        clock: Clock,
        config: Config,
        provider: Provider,
        inbox: ProviderInbox | None = None,
        settings: RunnerSettings | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.provider = provider
        self.inbox = inbox or ProviderInbox(clock)
        self.settings = settings or RunnerSettings()
        nodes, jobs = store.load()
        self.started_at = clock.now()
        self.nodes: dict[str, NodeRecord] = nodes
        self.jobs: dict[str, JobRecord] = jobs
        self.observed: dict[str, NodeObservation] = {}
        self.lock = asyncio.Lock()
        self.changed = asyncio.Event()  # set after every commit: wakes event followers
        self._planners: dict[str, Planner | str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.reconciles = 0
        self.coalesce_seconds = self.settings.coalesce_seconds
        self.capacity_ask: capacity.CapacityAsk | None = None  # the last level asked of the provider
        self.inbox.publish_busy(capacity.busy_nodes(self.nodes))
        self._wanted = 0  # observations that asked for a reconcile, counted
        self._decided = 0  # the newest of those that a finished reconcile included

    @property
    def world(self) -> World:
        return World(self.nodes, self.jobs, self.observed, self.started_at)

    def planner(self, job: JobRecord) -> Planner | str:
        cached = self._planners.get(job.id)
        if cached is None:
            try:
                profile = parse_profile(profile_path(job.spec).read_text(), what=f"profile {job.spec.profile}")
                cached = MemoPlanner(profile, job.spec.global_batch, job.spec.schedule)
            except (OSError, UserInputError) as exc:
                cached = f"profile: {exc}"
            self._planners[job.id] = cached
        return cached

    def commit(self, commands: list[Command]) -> None:
        """Persist, then update the mirror, then act: a crash in between loses nothing decided."""
        if not commands:
            return
        self.store.persist(commands)
        world = apply(self.world, commands)
        self.nodes, self.jobs = dict(world.nodes), dict(world.jobs)
        if any(isinstance(command, SetNode) for command in commands):
            self.inbox.publish_busy(capacity.busy_nodes(self.nodes))
        for command in commands:
            if isinstance(command, ReleaseInstance):
                self._spawn(self._release(command))
            if isinstance(command, RequestCapacity):
                self.capacity_ask = capacity.CapacityAsk(command.slots, self.clock.now())
                self._spawn(self._request_capacity(command))
            if isinstance(command, SetJob) and command.change:
                log.info(
                    "job %s: %s -> %s (%s)",
                    command.job.id,
                    command.change.source,
                    command.change.target,
                    command.change.reason,
                )
        self.changed.set()
        self.changed = asyncio.Event()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def tick(self) -> None:
        async with self.lock:
            self._reconcile()

    def _reconcile(self) -> None:
        """Log what the provider reported, decide, and ask for capacity if the wanted level changed."""
        active = (JobState.QUEUED, JobState.RUNNING, JobState.MORPHING)
        planners = {j.id: self.planner(j) for j in self.jobs.values() if j.state in active}
        self.reconciles += 1
        included = self._wanted  # every observation recorded so far is seen by this reconcile
        now = self.clock.now()
        commands = self._provider_events()
        commands += reconcile(self.world, now, self.config, planners)
        decided = apply(self.world, commands) if commands else self.world
        ask = capacity.next_ask(decided, now, self.capacity_ask, self.settings.capacity_retry_seconds)
        self.commit([*commands, ask] if ask else commands)
        self._decided = max(self._decided, included)

    def _provider_events(self) -> list[Command]:
        return [RecordEvent(e.kind, e.at, None, None, e.data) for e in self.inbox.drain()]

    async def _release(self, command: ReleaseInstance) -> None:
        try:
            await self.provider.release(command.node)
        except Exception as exc:  # an event (counted in spotmorph_provider_errors_total), never lost in a task
            log.warning("releasing %s failed: %s", command.node, exc)
            self.inbox.report(EventKind.PROVIDER_RELEASE_FAILED, {"node": command.node, "error": str(exc)})

    async def _request_capacity(self, command: RequestCapacity) -> None:
        """Ask the provider; the outcome is logged and tells the next decision whether to ask again."""
        try:
            await self.provider.request_capacity(command.slots)
        except Exception as exc:
            log.warning("capacity request for %d slots failed: %s", command.slots, exc)
            failed, data = True, {"slots": command.slots, "error": str(exc)}
        else:
            failed, data = False, {"slots": command.slots}
        async with self.lock:
            now = self.clock.now()
            if self.capacity_ask is not None and self.capacity_ask.slots == command.slots:
                self.capacity_ask = replace(self.capacity_ask, at=now, failed=failed)
            kind = EventKind.PROVIDER_CAPACITY_REQUEST_FAILED if failed else EventKind.CAPACITY_REQUESTED
            self.commit([RecordEvent(kind, now, None, None, data)])

    async def decide(self, make: Callable[[World, float], list[Command]]) -> None:
        """Run a pure decision on the current world and commit it, then reconcile."""
        async with self.lock:
            self.commit(make(self.world, self.clock.now()))
            self._reconcile()

    async def observe(self, name: str, seen: NodeObservation) -> None:
        """Record what a node reports; when it can change a decision, return only after a reconcile saw it."""
        previous = self.observed.get(name)
        self.observed[name] = seen
        node = self.nodes.get(name)
        joining = node is not None and node.state.value == "JOINING"
        if joining or _essence(previous) != _essence(seen):
            await self._reconcile_soon()

    async def _reconcile_soon(self) -> None:
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
                self._reconcile()

    async def submit(self, spec: JobSpec) -> JobRecord:
        async with self.lock:
            now = self.clock.now()
            job = self.store.add_job(lambda job_id: JobRecord(job_id, spec, JobState.QUEUED, now, now))
            self.jobs[job.id] = job
            self._reconcile()
            self.changed.set()
            self.changed = asyncio.Event()
            return self.jobs[job.id]

    async def cancel(self, job_id: str, who: str) -> JobRecord:
        await self.decide(lambda world, now: cancel(world, job_id, now, who))
        return self.jobs[job_id]

    async def poll_provider(self) -> None:
        """Nodes the provider no longer lists are GONE; without a list this time, only its events are logged."""
        try:
            listed: frozenset[str] | None = await self.provider.list_instances()
        except CannotList:
            listed = None
        await self.decide(lambda world, now: [] if listed is None else agents.provider_gone(world, listed, now))

    async def request_checkpoints(self) -> None:
        await self.decide(agents.request_checkpoints)

    async def settle(self) -> None:
        """Wait for the side effects under way (provider calls) and the outcomes they log."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Persist the last decisions, finish the side effects under way, close the provider, log its last words."""
        async with self.lock:
            self._reconcile()
        await self.settle()
        try:
            await self.provider.close()
        except Exception as exc:
            log.warning("closing the provider failed: %s", exc)
        async with self.lock:
            self.commit(self._provider_events())
