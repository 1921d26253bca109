"""The store on both databases (``store_target``: a SQLite file, then PostgreSQL): round trips, one transaction per
decision, migrations, fencing by key. State databases of older schema versions exist only as SQLite files (PostgreSQL
came with schema 17, so its databases are born at it): the tests that build one by hand stay on SQLite."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from controller.core.causes import MorphCause
from controller.core.changes import act, move
from controller.core.commands import AddJob
from controller.core.lifecycle import ACTION_TRANSITIONS, JobState, NodeState
from controller.core.model import Action, RankReport, RecordCheckpoint, SetJob, StartGeneration, Training, World, apply
from controller.core.reconcile import Config, reconcile
from controller.core.records import CheckpointRef, CheckpointStall, Evaluation, Exclusions, Morph, Salvage
from controller.eventlog.fact import EventDataError
from controller.eventlog.facts import NodeQuarantined
from controller.eventlog.schema import decode
from controller.persistence.codec import job_from_dict, job_to_dict, node_to_dict
from controller.persistence.old_rows import (
    JOB_FIELDS_BEFORE,
    JOB_FIELDS_V19,
    JOB_FIELDS_V20,
    legacy_morph_cause,
    nest_job_row,
    renamed,
)
from controller.persistence.plain import RowError
from controller.persistence.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError, database_url, migrate
from tests.controller.helpers import CHECKPOINT_REFS, job, node, planner, seen, version_9_row, version_15_row


def _running_world(store: Store) -> World:
    added = job("job-1")
    store.persist([AddJob(added, 1)])
    nodes = {f"node-{i}": node(f"node-{i}", at=-1.0) for i in (1, 2)}
    observed = {name: seen(0.0) for name in nodes}
    world = World(nodes, {added.id: added}, observed)
    commands = reconcile(world, 0.0, Config(debounce_seconds=0), {added.id: planner()})
    store.persist(commands)
    return apply(world, commands)


def test_round_trip_of_a_decision(store_target: Path | str) -> None:
    store = Store(store_target)
    world = _running_world(store)
    nodes, jobs = store.load()
    assert nodes == dict(world.nodes) and jobs == dict(world.jobs)
    assert jobs["job-1"].state is JobState.RUNNING
    assert [(g.generation, g.morph_cause, g.cause) for g in store.generations("job-1")] == [
        (1, MorphCause.ADMITTED, "admitted")
    ]
    kinds = [e.kind for e in store.events()]
    assert kinds[0] == "JobSubmitted" and "GenerationIssued" in kinds and "NodeStateChanged" in kinds
    store.close()
    reopened = Store(store_target)
    assert reopened.load() == (nodes, jobs)
    assert reopened.counters()[0] == 1, "the next job id continues after job-1"


def test_a_generation_is_never_issued_twice(store_target: Path | str) -> None:
    store = Store(store_target)
    world = _running_world(store)
    layout = world.jobs["job-1"].layout
    assert layout is not None
    before = store.load()
    with pytest.raises(IntegrityError):
        store.persist(
            [
                StartGeneration("job-1", 2, layout, CheckpointRef(), MorphCause.GROW, "x", None, 1.0),
                StartGeneration("job-1", 1, layout, CheckpointRef(), MorphCause.GROW, "again", None, 1.0),
            ]
        )
    assert store.load() == before  # the whole decision rolled back
    assert [g.generation for g in store.generations("job-1")] == [1]


def test_checkpoints_and_event_filter(store_target: Path | str) -> None:
    store = Store(store_target)
    world = _running_world(store)
    j = world.jobs["job-1"]
    ranks = [RankReport(j.id, 1, r, True, None, 12, 10) for r in range(4)]
    world = replace(world, observed={n: seen(1.0, *ranks) for n in world.nodes})
    store.persist(reconcile(world, 1.0, Config(debounce_seconds=0), {j.id: planner()}))
    assert store.checkpoints(j.id) == [10]
    assert all(e.job == j.id for e in store.events(job=j.id))
    assert store.events(after=10**9) == []


def test_steps_past_32_bits_are_kept(store_target: Path | str) -> None:
    """An agent reports steps as uint64: SQLite's INTEGER holds 64 bits, and PostgreSQL's columns are BIGINT."""
    store = Store(store_target)
    world = _running_world(store)
    far = 1 << 40
    store.persist([RecordCheckpoint("job-1", 1, far, 1.0)])
    assert store.checkpoints("job-1") == [far]
    layout = world.jobs["job-1"].layout
    assert layout is not None
    store.persist([StartGeneration("job-1", 2, layout, CheckpointRef(far, 1), MorphCause.GROW, "g", None, 2.0)])
    assert store.generations("job-1")[-1].resume_step == far


def test_migrations_step_by_step_and_newer_schema_is_refused(store_target: Path | str) -> None:
    engine = create_engine(database_url(store_target))
    assert migrate(engine, MIGRATIONS[:1]) == 1
    assert migrate(engine) == SCHEMA_VERSION
    indexes = {i["name"] for i in inspect(engine).get_indexes("events")}
    assert {"events_by_job", "events_by_decision"} <= indexes
    with engine.begin() as conn:
        conn.execute(text("UPDATE meta SET value='99' WHERE key='schema_version'"))
    engine.dispose()
    with pytest.raises(StoreError, match="newer"):
        Store(store_target)


def test_wal_mode(tmp_path: Path) -> None:
    """SQLite's journal (PostgreSQL has its own WAL, nothing to set)."""
    store = Store(tmp_path / "state.db")
    with store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    assert store.schema_version() == SCHEMA_VERSION
    assert NodeState.READY == "READY"


def test_a_morph_cause_round_trips_beside_its_words(store_target: Path | str) -> None:
    store = Store(store_target)
    world = _running_world(store)
    morphing = replace(
        world.jobs["job-1"],
        state=JobState.MORPHING,
        action=Action.STOP,
        morph=Morph(cause=MorphCause.EVICTION, detail="eviction notice: node-2"),
    )
    store.persist([SetJob(morphing)])
    assert store.load()[1]["job-1"] == morphing


def _legacy_database(path: Path) -> None:
    """A state file as a schema-2 controller left it: causes stored in words only."""
    engine = create_engine(f"sqlite:///{path}")
    migrate(engine, MIGRATIONS[:2])
    old = version_9_row(replace(job("job-1"), state=JobState.MORPHING, action=Action.ABORT))
    old.pop("morph_detail")
    old["morph_cause"] = "node lost: node-3; stop timed out"
    layout = json.dumps({"unused": True})
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE generations DROP COLUMN morph_cause"))
        conn.execute(text("ALTER TABLE generations DROP COLUMN pause_seconds"))
        conn.execute(text("ALTER TABLE generations DROP COLUMN stalled_seconds"))
        conn.execute(text("ALTER TABLE generations DROP COLUMN held_step"))
        conn.execute(text("INSERT INTO jobs VALUES ('job-1', 'MORPHING', 1, :data)"), {"data": json.dumps(old)})
        for generation, words in enumerate(["admitted", "eviction notice: node-2", "grow: 3 vs 2", "why not"], 1):
            conn.execute(
                text("INSERT INTO generations VALUES ('job-1', :g, :layout, 0, :words, 1.5, 10.0)"),
                {"g": generation, "layout": layout, "words": words},
            )
    engine.dispose()


def test_an_old_state_database_loads_with_causes_read_from_its_words(tmp_path: Path) -> None:
    _legacy_database(tmp_path / "old.db")
    store = Store(tmp_path / "old.db")
    assert store.schema_version() == SCHEMA_VERSION
    loaded = store.load()[1]["job-1"]
    assert (loaded.morph.cause, loaded.morph.detail) == (MorphCause.NODE_LOST, "node lost: node-3; stop timed out")
    causes = [(g.morph_cause, g.cause) for g in store.generations("job-1")]
    assert causes == [
        (MorphCause.ADMITTED, "admitted"),
        (MorphCause.EVICTION, "eviction notice: node-2"),
        (MorphCause.GROW, "grow: 3 vs 2"),
        (MorphCause.OTHER, "why not"),
    ]
    assert {(g.pause_seconds, g.stalled_seconds) for g in store.generations("job-1")} == {(None, None)}  # unmeasured
    store.close()
    assert Store(tmp_path / "old.db").load()[1]["job-1"] == loaded  # migrating again changes nothing


def test_causes_in_words_map_to_the_labels_metrics_used_to_give() -> None:
    assert legacy_morph_cause("eviction notice: node-2") is MorphCause.EVICTION
    assert legacy_morph_cause("node lost: node-3") is MorphCause.NODE_LOST
    assert legacy_morph_cause("trainers could not start on node-4; re-planning without it") is (
        MorphCause.TRAINER_START_FAILED
    )
    assert legacy_morph_cause("2 trainer(s) failed") is MorphCause.TRAINER_FAILED
    assert legacy_morph_cause("grow: 161 vs 86 samples/s; stop timed out") is MorphCause.GROW
    assert legacy_morph_cause("resumed") is MorphCause.RESUMED
    assert legacy_morph_cause("something new") is MorphCause.OTHER


def test_every_action_change_is_an_event_with_its_cause(store_target: Path | str) -> None:
    """A move that changes the action says so in its JobStateChanged event; an act alone is JobActionChanged."""
    store = Store(store_target)
    world = _running_world(store)
    running = world.jobs["job-1"]
    evicted = Morph(cause=MorphCause.EVICTION)
    morphing = move(running, JobState.MORPHING, "eviction notice", 2.0, action=Action.STOP, morph=evicted)
    aborting = act(morphing.job, Action.ABORT, "stop timed out", 3.0)
    store.persist([morphing, aborting])
    *_, moved, acted = store.events(job="job-1")
    assert (moved.kind, moved.data["from"], moved.data["to"]) == ("JobStateChanged", "RUNNING", "MORPHING")
    assert moved.data["action"] == {
        "from": "RUN", "to": "STOP", "cause": ACTION_TRANSITIONS[(Action.RUN, Action.STOP)], "reason": "eviction notice"
    }  # fmt: skip
    assert acted.kind == "JobActionChanged" and acted.at == 3.0
    cause = ACTION_TRANSITIONS[(Action.STOP, Action.ABORT)]
    assert acted.data == {"from": "STOP", "to": "ABORT", "cause": cause, "reason": "stop timed out"}
    assert store.load()[1]["job-1"].action is Action.ABORT


def test_each_persist_is_a_numbered_decision_stamped_on_its_events(store_target: Path | str) -> None:
    store = Store(store_target)
    first = store.persist([AddJob(job("job-1"), 1)])
    second = store.persist([AddJob(job("job-2"), 2), AddJob(job("job-3"), 3)])
    assert second == first + 1
    assert [(e.job, e.decision) for e in store.events()] == [("job-1", first), ("job-2", second), ("job-3", second)]
    assert [e.job for e in store.events(decision=second)] == ["job-2", "job-3"]
    store.close()
    reopened = Store(store_target)
    assert reopened.persist([AddJob(job("job-4"), 4)]) == second + 1, "numbers go on after a restart"


def test_events_written_before_decisions_were_numbered_have_none(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'v7.db'}")
    migrate(engine, MIGRATIONS[:7])
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE events DROP COLUMN decision"))  # as a database written by version 7 was
        conn.execute(
            text("INSERT INTO events (at, kind, job, node, data) VALUES (1.0, 'JobSubmitted', 'j', NULL, '{}')")
        )
    engine.dispose()
    store = Store(tmp_path / "v7.db")
    [old] = store.events()
    assert old.decision is None and old.kind == "JobSubmitted"
    decided = store.persist([AddJob(job("job-2"), 2)])
    assert [e.decision for e in store.events()] == [None, decided]


def stored_at(tmp_path: Path, version: int, insert: str, data: dict[str, Any]) -> Store:
    """A state database of schema ``version`` holding one row as that version wrote it (``insert`` with its
    ``:data``), opened (so migrated to today's schema) by the store."""
    path = tmp_path / f"v{version}.db"
    engine = create_engine(f"sqlite:///{path}")
    migrate(engine, MIGRATIONS[:version])
    with engine.begin() as conn:
        conn.execute(text(insert), {"data": json.dumps(data)})
    engine.dispose()
    return Store(path)


def test_schema_13_gives_old_generations_the_step_they_held_from_their_issue_events(tmp_path: Path) -> None:
    """A generation that took step 159 from memory resumed at 159, not at its checkpoint's 140, on every surface."""
    path = tmp_path / "v12.db"
    engine = create_engine(f"sqlite:///{path}")
    migrate(engine, MIGRATIONS[:12])
    layout = json.dumps({"unused": True})
    issued = [{"generation": 2, "resume_step": 140, "held_step": 159}, {"generation": 3, "resume_step": 180}]
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE generations DROP COLUMN held_step"))  # as version 12 wrote the table
        for generation in (1, 2, 3):
            conn.execute(
                text("INSERT INTO generations VALUES ('j', :g, :layout, :r, 'why', 1.0, 10.0, 'other', NULL, NULL)"),
                {"g": generation, "layout": layout, "r": {1: 0, 2: 140, 3: 180}[generation]},
            )
        for data in [*issued, {"generation": "2", "held_step": 999}, ["not", "a", "dict"]]:  # hostile rows: skipped
            conn.execute(
                text("INSERT INTO events (at, kind, job, data) VALUES (1.0, 'GenerationIssued', 'j', :data)"),
                {"data": json.dumps(data)},
            )
    engine.dispose()
    rows = Store(path).generations("j")
    found = [(g.resume_step, g.held_step, g.resumed_at_step) for g in rows]
    assert found == [(0, 0, 0), (140, 159, 159), (180, 0, 180)]


def test_the_job_codec_reads_rows_strictly_and_a_migration_completes_older_ones(tmp_path: Path) -> None:
    """One migration path: the codec has no defaults for absent fields; schema 9 writes them into old rows."""
    kept = replace(job("job-1"), exclusions=Exclusions(nodes=("node-2",)), morph=Morph(cause=MorphCause.GROW))
    row = job_to_dict(kept)
    assert job_from_dict(json.loads(json.dumps(row))) == kept
    for field in ("training", "exclusions", "held"):
        lacking = {k: v for k, v in row.items() if k != field}
        with pytest.raises(RowError, match=f"no {field} "):
            job_from_dict(lacking)
    with pytest.raises(RowError, match=r"job\.exclusions\.nodes: expected a list"):
        job_from_dict({**row, "exclusions": {**row["exclusions"], "nodes": "node-2"}})
    oldest = {k: v for k, v in row.items() if k in ("id", "spec", "state", "submitted_at", "state_since", "action")}
    oldest |= {"morph_cause": "", "training": {"loss": 2.5, "step": 7}}  # what rows of long ago held
    loaded = stored_at(tmp_path, 8, "INSERT INTO jobs VALUES ('job-1', 'QUEUED', 1, :data)", oldest).load()[1]["job-1"]
    assert loaded == replace(job("job-1"), training=Training(loss=2.5, step=7))


def test_schema_10_nests_a_version_9_job_row_keeping_every_value(tmp_path: Path) -> None:
    """Morph state, exclusions, the salvage and the measurements were flat fields of the row until version 10."""
    kept = replace(
        job("job-1"),
        state=JobState.MORPHING,
        action=Action.HOLD,
        morph=Morph(12.5, MorphCause.NODE_LOST, "node lost: node-3", 11.0, 0.25),
        exclusions=Exclusions(("node-3",), (("node-2", "node-1", 10.0),), (("node-4", 99.0),)),
        salvage=Salvage(("node-3",), 40, (0, 1), 30.0),
        evaluation=Evaluation(40, 2.75),
        checkpoint_stall=CheckpointStall(0.5, 39, 2),
    )
    flat = version_9_row(kept)
    assert set(flat) == {*JOB_FIELDS_BEFORE, "id", "spec", "state", "submitted_at", "state_since"}  # version 9's
    stored = stored_at(tmp_path, 9, "INSERT INTO jobs VALUES ('job-1', 'MORPHING', 1, :data)", flat)
    assert stored.load()[1]["job-1"] == kept


def test_schema_15_keeps_each_step_and_its_generation_of_a_version_14_job_row_as_one_record(tmp_path: Path) -> None:
    """The checkpoint a job resumed from, the step it holds and its newest checkpoint were flat pairs until 15."""
    kept = replace(
        job("job-1"),
        state=JobState.RUNNING,
        generation=4,
        resume=CheckpointRef(140, 2),
        held=CheckpointRef(159, 3),
        last_checkpoint=CheckpointRef(160, 4),
    )
    row = version_15_row(kept)
    for name in ("resume", "held", "last_checkpoint"):
        ref = row.pop(name)
        row |= {f"{name}_step": ref["step"], f"{name}_generation": ref["generation"]}
    stored = stored_at(tmp_path, 14, "INSERT INTO jobs VALUES ('job-1', 'RUNNING', 1, :data)", row)
    assert stored.load()[1]["job-1"] == kept
    assert stored.schema_version() == SCHEMA_VERSION


def test_a_damaged_version_9_row_is_refused_naming_the_field_it_lacks() -> None:
    flat = version_9_row(job("job-1"))
    del flat["morph_cause"]
    with pytest.raises(RowError, match=r"job\.morph: no cause"):
        job_from_dict(
            {
                **JOB_FIELDS_V19,
                **JOB_FIELDS_V20,
                **renamed(nest_job_row(nest_job_row(flat), CHECKPOINT_REFS), "hold", "salvage"),
            }
        )


def test_schema_12_gives_a_version_11_node_row_its_new_fields(tmp_path: Path) -> None:
    """A node row of version 11 lacks ``suspected_at`` and ``name_taken_at``: the codec would refuse it, the
    migration writes them as they were before they existed (none suspected, the name never taken over)."""
    kept = node("node-1", NodeState.READY)
    as_then = renamed(node_to_dict(kept), "quarantined_until", "held_until")  # schema 16 renamed it
    row = {k: v for k, v in as_then.items() if k not in ("suspected_at", "name_taken_at")}
    stored = stored_at(tmp_path, 11, "INSERT INTO nodes VALUES ('node-1', 1, 'READY', :data)", row)
    assert stored.load()[0]["node-1"] == kept


def test_schema_16_names_a_flapping_nodes_wait_a_quarantine_and_a_jobs_salvage_record_salvage(tmp_path: Path) -> None:
    """Until 16 a node row said ``held_until``, a job row ``hold`` and a flapping node's event ``NodeHeld``
    (with ``hold_seconds``): a state directory of version 15 loads, and its old events decode as the new kind."""
    quarantined = replace(node("node-1", NodeState.JOINING), flaps=2, flapped_at=5.0, quarantined_until=40.0)
    salvaging = replace(
        job("job-1"), state=JobState.MORPHING, action=Action.HOLD, salvage=Salvage(("node-3",), 40, (0, 1), 30.0)
    )
    said = {"flaps": 2, "lost_at": 5.0, "hold_seconds": 20.0, "until": 40.0, "message": "back 3.0 s after LOST"}
    path = tmp_path / "v15.db"
    engine = create_engine(f"sqlite:///{path}")
    migrate(engine, MIGRATIONS[:15])
    with engine.begin() as conn:
        node_row = renamed(node_to_dict(quarantined), "quarantined_until", "held_until")
        conn.execute(text("INSERT INTO nodes VALUES ('node-1', 1, 'JOINING', :data)"), {"data": json.dumps(node_row)})
        job_row = json.dumps(version_15_row(salvaging))
        conn.execute(text("INSERT INTO jobs VALUES ('job-1', 'MORPHING', 1, :data)"), {"data": job_row})
        for kind, data in [("NodeHeld", said), ("NodeRegistered", {"hold_seconds": 1}), ("NodeHeld", ["damaged"])]:
            conn.execute(
                text("INSERT INTO events (at, kind, node, data) VALUES (1.0, :kind, 'node-1', :data)"),
                {"kind": kind, "data": json.dumps(data)},
            )
    engine.dispose()
    store = Store(path)
    nodes, jobs = store.load()
    assert nodes["node-1"] == quarantined and jobs["job-1"] == salvaging
    flapped, registered, damaged = store.events()
    assert decode(flapped.kind, flapped.data) == NodeQuarantined(2, 5.0, 20.0, 40.0, "back 3.0 s after LOST")
    assert (registered.kind, registered.data) == ("NodeRegistered", {"hold_seconds": 1}), "other kinds are left"
    with pytest.raises(EventDataError, match="NodeQuarantined event: expected an object"):
        decode(damaged.kind, damaged.data)
    assert store.schema_version() == SCHEMA_VERSION
