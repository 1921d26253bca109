"""The SQLite store on a real file: round trips, one transaction per decision, migrations, fencing by key."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from controller.core.lifecycle import JobState, NodeState
from controller.core.model import RankReport, StartGeneration, World, apply
from controller.core.reconcile import Config, reconcile
from controller.persistence.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError, migrate
from tests.controller.helpers import job, node, planner, seen


def _running_world(store: Store) -> World:
    added = store.add_job(lambda job_id: job(job_id))
    nodes = {f"node-{i}": node(f"node-{i}", at=-1.0) for i in (1, 2)}
    observed = {name: seen(0.0) for name in nodes}
    world = World(nodes, {added.id: added}, observed)
    commands = reconcile(world, 0.0, Config(debounce_seconds=0), {added.id: planner()})
    store.persist(commands)
    return apply(world, commands)


def test_round_trip_of_a_decision(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    world = _running_world(store)
    nodes, jobs = store.load()
    assert nodes == dict(world.nodes) and jobs == dict(world.jobs)
    assert jobs["job-1"].state is JobState.RUNNING
    assert [g.generation for g in store.generations("job-1")] == [1]
    kinds = [e.kind for e in store.events()]
    assert kinds[0] == "JobSubmitted" and "GenerationIssued" in kinds and "NodeStateChanged" in kinds
    store.close()
    reopened = Store(tmp_path / "state.db")
    assert reopened.load() == (nodes, jobs)
    assert reopened.add_job(lambda job_id: job(job_id)).id == "job-2"


def test_a_generation_is_never_issued_twice(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    world = _running_world(store)
    layout = world.jobs["job-1"].layout
    assert layout is not None
    before = store.load()
    with pytest.raises(IntegrityError):
        store.persist(
            [
                StartGeneration("job-1", 2, layout, 0, "x", None, 1.0),
                StartGeneration("job-1", 1, layout, 0, "again", None, 1.0),
            ]
        )
    assert store.load() == before  # the whole decision rolled back
    assert [g.generation for g in store.generations("job-1")] == [1]


def test_checkpoints_and_event_filter(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    world = _running_world(store)
    j = world.jobs["job-1"]
    ranks = [RankReport(j.id, 1, r, True, None, 12, 10) for r in range(4)]
    world = replace(world, observed={n: seen(1.0, *ranks) for n in world.nodes})
    store.persist(reconcile(world, 1.0, Config(debounce_seconds=0), {j.id: planner()}))
    assert store.checkpoints(j.id) == [10]
    assert all(e.job == j.id for e in store.events(job=j.id))
    assert store.events(after=10**9) == []


def test_migrations_step_by_step_and_newer_schema_is_refused(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    assert migrate(engine, MIGRATIONS[:1]) == 1
    assert migrate(engine) == SCHEMA_VERSION
    with engine.begin() as conn:
        indexes = conn.execute(text("SELECT name FROM sqlite_master WHERE type='index'")).scalars().all()
        assert "events_by_job" in indexes
        conn.execute(text("UPDATE meta SET value='99' WHERE key='schema_version'"))
    engine.dispose()
    with pytest.raises(StoreError, match="newer"):
        Store(tmp_path / "old.db")


def test_wal_mode(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    with store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    assert store.schema_version() == SCHEMA_VERSION
    assert NodeState.READY == "READY"
