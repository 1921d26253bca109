"""A read-only view of the controller's state: what the API and the metrics may look at.

Records the runner holds in memory are read on the event loop (where the runner changes them) and
handed out as frozen values. Anything that needs SQLite (generations, the event log, event counts)
is read on a small pool of reader threads, each with its own pooled connection (WAL lets them read
while the runner writes), so no query blocks the loop. Nothing here writes: changes go through the
runner (submit, cancel, decide, observe).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from controller.core import intake
from controller.core.flapping import Damping
from controller.core.lifecycle import JobState
from controller.core.model import Assignment, JobRecord, NodeObservation, NodeRecord, World
from controller.core.reconcile import assignment_for
from controller.core.reconcile.growth import assignment_soon, growth_hint
from controller.core.reconcile.sharing import grants_now
from controller.core.scheduler_status import OnDemandStatus, on_demand_status
from controller.persistence.store import EventRow, GenerationRow, Store
from controller.shell.latency import Histogram
from controller.shell.runner import Runner
from morphing.jobspec import JobSpec
from scheduler.queue import QueueEntry, admission_order

READER_THREAD_PREFIX = "spotmorph-store-reader"
T = TypeVar("T")


def join_order(node: NodeRecord) -> tuple[float, str]:
    """How nodes are listed: in join order, ties by name (ListNodes pages by it)."""
    return node.joined_at, node.name


@dataclass(frozen=True)
class JobDetail:
    """A job with the generations issued to it (none newer than the record's own)."""

    job: JobRecord
    generations: tuple[GenerationRow, ...]
    on_demand: OnDemandStatus | None = None  # why it holds on-demand capacity (None: it may use none, holds none)


@dataclass(frozen=True)
class LatencySnapshot:
    """A heartbeat-latency histogram at one moment (buckets of :data:`controller.shell.latency.BOUNDS`)."""

    counts: tuple[int, ...]
    count: int
    sum_seconds: float


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: tuple[NodeRecord, ...]  # in join order
    jobs: tuple[JobRecord, ...]  # in submission order
    queue: tuple[str, ...]  # queued job ids in admission order
    started_at: float
    heartbeat_latency: LatencySnapshot


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one Prometheus scrape reports, taken at ``now``."""

    now: float
    nodes: tuple[NodeRecord, ...]
    jobs: tuple[JobRecord, ...]
    generations: tuple[GenerationRow, ...]  # of every job in ``jobs``
    event_counts: Mapping[str, int]  # events in the log by kind
    heartbeat_latency: LatencySnapshot
    leading: bool = True  # this controller leads (a standby's scrape says False)
    epoch: int = 0  # its lease epoch while leading
    on_demand: Mapping[str, OnDemandStatus] = field(
        default_factory=lambda: MappingProxyType({})
    )  # by job: those that may use or hold some


class StateView:
    """Queries on the runner's state; call it from the event loop, ``close()`` after the last query."""

    def __init__(
        self,
        runner: Runner,
        heartbeat_latency: Histogram,
        readers: int = 2,
        role: Callable[[], tuple[bool, int]] = lambda: (True, 0),
    ) -> None:
        """``role``: whether this controller leads, and its epoch (the metrics say both)."""
        self._runner = runner
        self._role = role
        self._store: Store = runner.store
        self._heartbeat_latency = heartbeat_latency
        self._grants: tuple[tuple[object, object], Mapping[str, str] | None] | None = None  # per commit
        self.grants_decided = 0  # how often the grants were decided for hints (once per commit at most)
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix=READER_THREAD_PREFIX)

    def close(self) -> None:
        """Wait for reads in flight, then stop the reader threads."""
        self._readers.shutdown(wait=True)

    # In memory: answered at once, on the loop.

    def now(self) -> float:
        return self._runner.clock.now()

    @property
    def heartbeat_expiry_seconds(self) -> float:
        return self._runner.config.heartbeat_expiry_seconds

    @property
    def damping(self) -> Damping:
        return self._runner.config.damping

    def job(self, job_id: str) -> JobRecord | None:
        return self._runner.jobs.get(job_id)

    def jobs(self) -> tuple[JobRecord, ...]:
        return tuple(self._runner.jobs.values())

    def node(self, name: str) -> NodeRecord | None:
        return self._runner.nodes.get(name)

    def nodes(self) -> tuple[NodeRecord, ...]:
        return tuple(sorted(self._runner.nodes.values(), key=join_order))

    def observation(self, name: str) -> NodeObservation | None:
        return self._runner.observed.get(name)

    def on_demand(self, job: JobRecord) -> OnDemandStatus | None:
        """Why ``job`` holds on-demand capacity, the numbers behind it and its cost so far."""
        config = self._runner.config
        return on_demand_status(job, self._runner.nodes.values(), self.now(), config.on_demand_gpu_hour_price)

    def check_incarnation(self, name: str, incarnation: int) -> NodeRecord:
        """The node when ``incarnation`` is its current one; LookupError or :class:`intake.Stale` if not."""
        return intake.check_incarnation(self._runner.world, name, incarnation)

    def assignment(self, name: str, ranks_of: Mapping[str, tuple[int, ...]] | None = None) -> Assignment | None:
        """What node ``name`` should run now (``ranks_of``: its job's ranks by node, when known)."""
        return assignment_for(self._runner.world, name, ranks_of)

    def growth_hint(self, name: str) -> tuple[str, JobSpec] | None:
        """The job most likely to be placed on the free node ``name`` next (the one the scheduler granted it, while
        it shares the GPUs), and its trainers' spec."""
        world, now = self._runner.world, self.now()
        return growth_hint(world, name, now, self.grants(world, now))

    def grants(self, world: World, now: float) -> Mapping[str, str] | None:
        """The scheduler's grants (:func:`~controller.core.reconcile.sharing.grants_now`), decided once per commit
        (the runner replaces its jobs and nodes on each), not once per heartbeat. A decision that fails gives none:
        a hint is never worth a failed heartbeat (the runner's own pass contains and reports the failure)."""
        committed = (self._runner.jobs, self._runner.nodes)
        cached = self._grants
        if cached is None or cached[0][0] is not committed[0] or cached[0][1] is not committed[1]:
            try:
                decided = grants_now(world, now, self._runner.config, self._runner.planner.live(world))
            except Exception:  # contained: reported by the reconcile that decides the same
                decided = None
            cached = self._grants = (committed, decided)
            self.grants_decided += 1
        return cached[1]

    def assignment_soon(self, name: str, hinted: bool) -> bool:
        """Whether the free node ``name`` may be given work within seconds (it is then told to beat often)."""
        return assignment_soon(self._runner.world, name, self.now(), self._runner.config, hinted)

    def next_change(self) -> asyncio.Event:
        """An event set by the next commit: take it before reading, so no commit goes unnoticed."""
        return self._runner.changed

    def heartbeat_latency(self) -> LatencySnapshot:
        h = self._heartbeat_latency
        return LatencySnapshot(tuple(h.counts), h.count, h.sum)

    def cluster(self) -> ClusterSnapshot:
        jobs = self.jobs()
        queued = [QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in jobs if j.state is JobState.QUEUED]
        return ClusterSnapshot(
            nodes=self.nodes(),
            jobs=jobs,
            queue=tuple(e.job_id for e in admission_order(queued)),
            started_at=self._runner.started_at,
            heartbeat_latency=self.heartbeat_latency(),
        )

    # From the store: read on a reader thread while the loop goes on.

    async def job_detail(self, job_id: str) -> JobDetail | None:
        job = self.job(job_id)
        if job is None:
            return None
        return (await self._details((job,)))[0]

    async def job_details(self, jobs: tuple[JobRecord, ...] | None = None) -> tuple[JobDetail, ...]:
        """``jobs`` (default: every job, in submission order) with their generations."""
        return await self._details(self.jobs() if jobs is None else jobs)

    async def events(
        self, after: int = 0, job: str | None = None, limit: int = 1000, decision: int | None = None
    ) -> tuple[EventRow, ...]:
        """Up to ``limit`` events with a sequence number above ``after`` (of ``job``, of ``decision``, when given)."""
        return tuple(await self._read(self._store.events, after, job, limit, decision))

    async def recent_events(self, job: str | None, kinds: Sequence[str] | None, limit: int) -> tuple[EventRow, ...]:
        """The newest ``limit`` events (of ``job``, of ``kinds``, when given), oldest first."""
        return tuple(await self._read(self._store.recent_events, job, kinds, limit))

    async def metrics(self) -> MetricsSnapshot:
        now, nodes, jobs, latency = self.now(), self.nodes(), self.jobs(), self.heartbeat_latency()

        def read() -> tuple[tuple[GenerationRow, ...], dict[str, int]]:
            rows = tuple(row for job in jobs for row in self._store.generations(job.id))
            return rows, self._store.event_counts()

        generations, counts = await self._read(read)
        leading, epoch = self._role()
        holds = MappingProxyType({j.id: hold for j in jobs if (hold := self.on_demand(j)) is not None})
        return MetricsSnapshot(now, nodes, jobs, generations, MappingProxyType(counts), latency, leading, epoch, holds)

    async def _details(self, jobs: tuple[JobRecord, ...]) -> tuple[JobDetail, ...]:
        """Generations a job's record does not know of yet (issued after it was read) are left out."""
        holds = {job.id: self.on_demand(job) for job in jobs}  # in memory, on the loop

        def read() -> tuple[JobDetail, ...]:
            return tuple(
                JobDetail(
                    job,
                    tuple(g for g in self._store.generations(job.id) if g.generation <= job.generation),
                    holds[job.id],
                )
                for job in jobs
            )

        return await self._read(read)

    async def _read(self, query: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, functools.partial(query, *args))
