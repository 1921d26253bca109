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
from typing import Any, Protocol

from controller import agents
from controller.lifecycle import JobState
from controller.model import (
    Command,
    JobRecord,
    NodeObservation,
    NodeRecord,
    ReleaseInstance,
    SetJob,
    World,
    apply,
)
from controller.providers import Provider
from controller.reconcile import Config, cancel, reconcile
from controller.spec import JobSpec, profile_path
from controller.store import Store
from morphing.errors import UserInputError
from morphing.layout import Layout
from morphing.planner import Planner, PlanResult
from morphing.profile import parse_profile

log = logging.getLogger("spotmorph.controller")


class Clock(Protocol):
    def now(self) -> float: ...


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


class Runner:
    def __init__(self, store: Store, clock: Clock, config: Config, provider: Provider) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.provider = provider
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
        self.coalesce_seconds = 0.005  # how long the first of a burst of state changes waits for others
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
        for command in commands:
            if isinstance(command, ReleaseInstance):
                self._spawn(self.provider.release(command.node))
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
        active = (JobState.QUEUED, JobState.RUNNING, JobState.MORPHING)
        planners = {j.id: self.planner(j) for j in self.jobs.values() if j.state in active}
        self.reconciles += 1
        included = self._wanted  # every observation recorded so far is seen by this reconcile
        self.commit(reconcile(self.world, self.clock.now(), self.config, planners))
        self._decided = max(self._decided, included)

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
        try:
            listed = await self.provider.list_instances()
        except NotImplementedError:
            return
        await self.decide(lambda world, now: agents.provider_gone(world, listed, now))

    async def request_checkpoints(self) -> None:
        await self.decide(agents.request_checkpoints)
