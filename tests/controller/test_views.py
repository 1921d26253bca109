"""The state view on a real runner and store: frozen values, consistent job details, store reads on
reader threads and never on the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from controller.core import intake
from controller.core.causes import MorphCause
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Command, NodeObservation, StartGeneration, World
from controller.core.reconcile import Config
from controller.core.reconcile.waits import WAITS_FOR_ROOM
from controller.core.records import CheckpointRef
from controller.persistence.store import Store
from controller.providers.base import StaticProvider
from controller.shell.latency import Histogram
from controller.shell.runner import Runner
from controller.shell.views import READER_THREAD_PREFIX, StateView
from tests.controller.helpers import FakeClock, recording_reads, spec, write_profile


@dataclasses.dataclass
class Harness:
    runner: Runner
    view: StateView
    clock: FakeClock
    latency: Histogram
    profile: Path

    async def join(self, name: str) -> None:
        """A node registers and heartbeats once: READY."""

        def register(world: World, now: float) -> list[Command]:
            return intake.register(world, name, 1, "127.0.0.1", now)[1]

        await self.runner.decide(register)
        await self.runner.observe(name, NodeObservation(1, self.clock.now()))


@asynccontextmanager
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    store = Store(tmp_path / "state.db")
    clock = FakeClock()
    runner = Runner(store, clock, Config(debounce_seconds=0.0), StaticProvider())
    runner.coalesce_seconds = 0.0
    latency = Histogram()
    view = StateView(runner, latency)
    try:
        yield Harness(runner, view, clock, latency, write_profile(tmp_path))
    finally:
        view.close()
        store.close()


def test_values_are_frozen_and_later_commits_leave_them_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            first = await h.runner.submit(spec(name="first"))
            jobs, cluster = h.view.jobs(), h.view.cluster()
            detail = await h.view.job_detail(first.id)
            assert detail is not None and detail.job == first and detail.generations == ()
            await h.runner.submit(spec(name="second", checkpoint_dir="/tmp/c2"))
            await h.join("n1")
            assert jobs == (first,) and cluster.jobs == (first,) and cluster.nodes == ()
            assert [j.spec.name for j in h.view.jobs()] == ["first", "second"]
            assert [n.name for n in h.view.nodes()] == ["n1"]
            with pytest.raises(dataclasses.FrozenInstanceError):
                detail.generations = ()  # type: ignore[misc]
            assert await h.view.job_detail("job-404") is None and h.view.job("job-404") is None

    asyncio.run(scenario())


def test_a_job_detail_holds_no_generation_newer_than_its_record(tmp_path: Path) -> None:
    """A generation committed while the detail is read (here: written behind the runner's back) waits
    for the record that knows of it."""

    async def scenario() -> None:
        async with harness(tmp_path) as h:
            await h.join("n1")
            job = await h.runner.submit(spec(profile=str(h.profile)))
            running = h.view.job(job.id)
            assert running is not None and running.state is JobState.RUNNING and running.layout is not None
            later = StartGeneration(
                job.id, 2, running.layout, CheckpointRef(), MorphCause.GROW, "grow", 1.0, h.clock.now()
            )
            h.runner.store.persist([later])
            detail = await h.view.job_detail(job.id)
            assert detail is not None and [g.generation for g in detail.generations] == [1]
            (listed,) = await h.view.job_details()
            assert listed == detail

    asyncio.run(scenario())


def test_events_after_a_sequence_number_of_one_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            await h.join("n1")
            first = await h.runner.submit(spec(profile=str(h.profile)))
            # queued: n1 is taken
            second = await h.runner.submit(spec(profile=str(h.profile), checkpoint_dir="/tmp/c2"))
            everything = await h.view.events()
            assert [e.seq for e in everything] == sorted(e.seq for e in everything)
            assert {"JobSubmitted", "NodeRegistered"} <= {e.kind for e in everything}
            after = everything[0].seq
            assert await h.view.events(after, limit=2) == everything[1:3]
            submitted, waits = await h.view.events(job=second.id)  # and the reason it waits, said once
            assert (submitted.kind, waits.kind) == ("JobSubmitted", "JobStateChanged")
            assert waits.data["reason"] == WAITS_FOR_ROOM
            assert all(e.job == first.id for e in await h.view.events(job=first.id))

    asyncio.run(scenario())


def test_the_cluster_snapshot_queues_by_priority_then_submission(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            profile = str(h.profile)
            low = await h.runner.submit(spec(priority=0, profile=profile))
            h.clock.at += 1
            high = await h.runner.submit(spec(priority=5, profile=profile, checkpoint_dir="/tmp/c2"))
            h.clock.at += 1
            low_later = await h.runner.submit(spec(priority=0, profile=profile, checkpoint_dir="/tmp/c3"))
            h.latency.record(0.002)
            cluster = h.view.cluster()
            assert cluster.queue == (high.id, low.id, low_later.id)
            assert cluster.started_at == 1000.0 and h.view.now() == 1002.0
            assert cluster.heartbeat_latency.count == 1 and sum(cluster.heartbeat_latency.counts) == 1
            h.latency.record(0.002)
            assert cluster.heartbeat_latency.count == 1, "a snapshot is a copy, not the live histogram"

    asyncio.run(scenario())


def test_node_queries_fence_incarnations_and_give_assignments(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            await h.join("n1")
            assert h.view.check_incarnation("n1", 1).state is NodeState.READY
            with pytest.raises(intake.Stale):
                h.view.check_incarnation("n1", 2)
            with pytest.raises(LookupError):
                h.view.check_incarnation("n9", 1)
            assert h.view.assignment("n1") is None
            job = await h.runner.submit(spec(profile=str(h.profile)))
            assignment = h.view.assignment("n1")
            assert assignment is not None and (assignment.job, assignment.generation) == (job.id, 1)
            seen = h.view.observation("n1")
            assert seen is not None and seen.incarnation == 1 and h.view.observation("n9") is None
            assert h.view.heartbeat_expiry_seconds == Config().heartbeat_expiry_seconds

    asyncio.run(scenario())


def test_store_reads_run_on_reader_threads(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tmp_path) as h:
            await h.join("n1")
            job = await h.runner.submit(spec(profile=str(h.profile)))
            reads = recording_reads(h.runner.store)
            await h.view.job_detail(job.id)
            await h.view.job_details()
            await h.view.events(0, job.id)
            snapshot = await h.view.metrics()
            assert [g.generation for g in snapshot.generations] == [1]
            assert snapshot.event_counts["JobSubmitted"] == 1 and snapshot.now == h.clock.now()
            assert {method for method, _ in reads} == {"generations", "events", "event_counts"}
            elsewhere = [(method, t.name) for method, t in reads if not t.name.startswith(READER_THREAD_PREFIX)]
            assert elsewhere == [], "store reads ran outside the reader threads"

    asyncio.run(scenario())
