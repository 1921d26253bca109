"""The persistent store: SQLite in WAL mode through SQLAlchemy Core, a versioned schema, an event log.

Everything the controller needs after ``kill -9`` is here: nodes and their incarnations, jobs with
their specs, every generation issued with its assignments (a primary key makes issuing a generation
twice impossible), committed checkpoints, and an append-only event log. Commands from reconcile are
written in one transaction, so a crash leaves either all of a decision or none of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from controller.core.lifecycle import JobState, NodeState
from controller.core.model import (
    Action,
    Command,
    JobRecord,
    NodeRecord,
    RecordCheckpoint,
    RecordEvent,
    SetJob,
    SetNode,
    StartGeneration,
    ranks_by_node,
)
from controller.spec import JobSpec
from morphing.layout import Layout

SCHEMA_VERSION = 2

metadata = MetaData()
meta = Table("meta", metadata, Column("key", String, primary_key=True), Column("value", String, nullable=False))
nodes = Table(
    "nodes",
    metadata,
    Column("name", String, primary_key=True),
    Column("incarnation", Integer, nullable=False),
    Column("state", String, nullable=False),
    Column("data", JSON, nullable=False),
)
incarnations = Table(
    "incarnations",
    metadata,
    Column("node", String, primary_key=True),
    Column("incarnation", Integer, primary_key=True),
    Column("registered_at", Float, nullable=False),
)
jobs = Table(
    "jobs",
    metadata,
    Column("id", String, primary_key=True),
    Column("state", String, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("data", JSON, nullable=False),
)
generations = Table(
    "generations",
    metadata,
    Column("job", String, primary_key=True),
    Column("generation", Integer, primary_key=True),
    Column("layout", JSON, nullable=False),
    Column("resume_step", Integer, nullable=False),
    Column("cause", String, nullable=False),
    Column("morph_seconds", Float),
    Column("issued_at", Float, nullable=False),
)
assignments = Table(
    "assignments",
    metadata,
    Column("job", String, primary_key=True),
    Column("generation", Integer, primary_key=True),
    Column("node", String, primary_key=True),
    Column("ranks", JSON, nullable=False),
)
checkpoints = Table(
    "checkpoints",
    metadata,
    Column("job", String, primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("generation", Integer, nullable=False),
    Column("committed_at", Float, nullable=False),
)
events = Table(
    "events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("kind", String, nullable=False),
    Column("job", String),
    Column("node", String),
    Column("data", JSON, nullable=False),
)


def _v1(conn: Connection) -> None:
    metadata.create_all(conn)


def _v2(conn: Connection) -> None:
    conn.execute(text("CREATE INDEX IF NOT EXISTS events_by_job ON events (job, seq)"))


# MIGRATIONS[i] takes a database at version i to version i + 1; never edit a released one, append.
MIGRATIONS: tuple[Callable[[Connection], None], ...] = (_v1, _v2)
assert len(MIGRATIONS) == SCHEMA_VERSION


class StoreError(RuntimeError):
    """The state directory cannot be used (newer schema, unreadable file); the message says what to do."""


@dataclass(frozen=True)
class EventRow:
    seq: int
    at: float
    kind: str
    job: str | None
    node: str | None
    data: dict[str, Any]


@dataclass(frozen=True)
class GenerationRow:
    job: str
    generation: int
    layout: dict[str, Any]
    resume_step: int
    cause: str
    morph_seconds: float | None
    issued_at: float


def node_to_dict(node: NodeRecord) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, NodeState) else v) for k, v in asdict(node).items()}


def node_from_dict(data: dict[str, Any]) -> NodeRecord:
    return NodeRecord(**{**data, "state": NodeState(data["state"])})


def job_to_dict(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id,
        "spec": job.spec.model_dump(),
        "state": str(job.state),
        "submitted_at": job.submitted_at,
        "state_since": job.state_since,
        "generation": job.generation,
        "layout": job.layout.to_dict() if job.layout else None,
        "action": str(job.action),
        "rendezvous": job.rendezvous,
        "resume_step": job.resume_step,
        "step": job.step,
        "last_checkpoint_step": job.last_checkpoint_step,
        "steps_lost": job.steps_lost,
        "restarts": job.restarts,
        "checkpoint_request": job.checkpoint_request,
        "morph_started_at": job.morph_started_at,
        "morph_cause": job.morph_cause,
        "reason": job.reason,
        "excluded_nodes": list(job.excluded_nodes),
    }


def job_from_dict(data: dict[str, Any]) -> JobRecord:
    fields = dict(data)
    fields["spec"] = JobSpec.model_validate(data["spec"])
    fields["state"] = JobState(data["state"])
    fields["action"] = Action(data["action"])
    fields["layout"] = Layout.from_dict(data["layout"]) if data["layout"] else None
    fields["excluded_nodes"] = tuple(data.get("excluded_nodes", ()))  # absent in rows written before it existed
    return JobRecord(**fields)


class Store:
    """One SQLite file; a single writer (the controller), readers may use other connections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.engine: Engine = create_engine(f"sqlite:///{path}", future=True)
        event.listen(self.engine, "connect", _pragmas)
        migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return _version(conn)

    def load(self) -> tuple[dict[str, NodeRecord], dict[str, JobRecord]]:
        with self.engine.connect() as conn:
            node_rows = conn.execute(select(nodes.c.data)).scalars()
            loaded_nodes = {n.name: n for n in map(node_from_dict, node_rows)}
            job_rows = conn.execute(select(jobs.c.data).order_by(jobs.c.seq)).scalars()
            loaded_jobs = {j.id: j for j in map(job_from_dict, job_rows)}
        return loaded_nodes, loaded_jobs

    def next_job_id(self, conn: Connection) -> tuple[str, int]:
        seq = int(conn.execute(select(meta.c.value).where(meta.c.key == "job_seq")).scalar() or 0) + 1
        conn.execute(
            sqlite_insert(meta)
            .values(key="job_seq", value=str(seq))
            .on_conflict_do_update(index_elements=["key"], set_={"value": str(seq)})
        )
        return f"job-{seq}", seq

    def add_job(self, make: Callable[[str], JobRecord]) -> JobRecord:
        """A new job with the next id, stored with its JobSubmitted event in one transaction."""
        with self.engine.begin() as conn:
            job_id, seq = self.next_job_id(conn)
            job = make(job_id)
            conn.execute(insert(jobs).values(id=job.id, state=str(job.state), seq=seq, data=job_to_dict(job)))
            conn.execute(
                insert(events).values(
                    at=job.submitted_at, kind="JobSubmitted", job=job.id, node=None, data={"name": job.spec.name}
                )
            )
        return job

    def persist(self, commands: Iterable[Command]) -> None:
        """One transaction; consecutive node updates (a generation issued on 1,000 nodes) are batched."""
        with self.engine.begin() as conn:
            batch: list[SetNode] = []
            for command in commands:
                if isinstance(command, SetNode):
                    batch.append(command)
                    continue
                if batch:
                    _write_nodes(conn, batch)
                    batch = []
                _write(conn, command)
            if batch:
                _write_nodes(conn, batch)

    def event_counts(self) -> dict[str, int]:
        """How many events of each kind the log holds (for metrics)."""
        query = select(events.c.kind, func.count()).group_by(events.c.kind)
        with self.engine.connect() as conn:
            return {str(kind): int(count) for kind, count in conn.execute(query)}

    def events(self, after: int = 0, job: str | None = None, limit: int = 1000) -> list[EventRow]:
        query = select(events).where(events.c.seq > after).order_by(events.c.seq).limit(limit)
        if job is not None:
            query = query.where(events.c.job == job)
        with self.engine.connect() as conn:
            return [EventRow(r.seq, r.at, r.kind, r.job, r.node, r.data) for r in conn.execute(query)]

    def generations(self, job: str) -> list[GenerationRow]:
        query = select(generations).where(generations.c.job == job).order_by(generations.c.generation)
        with self.engine.connect() as conn:
            return [
                GenerationRow(r.job, r.generation, r.layout, r.resume_step, r.cause, r.morph_seconds, r.issued_at)
                for r in conn.execute(query)
            ]

    def checkpoints(self, job: str) -> list[int]:
        query = select(checkpoints.c.step).where(checkpoints.c.job == job).order_by(checkpoints.c.step)
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())


def _pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def _version(conn: Connection) -> int:
    if not conn.dialect.has_table(conn, "meta"):
        return 0
    value = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    return int(value) if value is not None else 0


def migrate(engine: Engine, migrations: Sequence[Callable[[Connection], None]] = MIGRATIONS) -> int:
    """Bring the schema to the newest version, one transaction per step; refuse a newer database."""
    with engine.begin() as conn:
        current = _version(conn)
    if current > len(migrations):
        raise StoreError(
            f"the state database is at schema version {current}, newer than this controller's "
            f"{len(migrations)}; upgrade spotmorph or point --state-dir elsewhere"
        )
    for version in range(current, len(migrations)):
        with engine.begin() as conn:
            migrations[version](conn)
            conn.execute(
                sqlite_insert(meta)
                .values(key="schema_version", value=str(version + 1))
                .on_conflict_do_update(index_elements=["key"], set_={"value": str(version + 1)})
            )
    return len(migrations)


_upsert_node = sqlite_insert(nodes)
UPSERT_NODE = _upsert_node.on_conflict_do_update(
    index_elements=["name"],
    set_={
        "incarnation": _upsert_node.excluded.incarnation,
        "state": _upsert_node.excluded.state,
        "data": _upsert_node.excluded.data,
    },
)
ADD_INCARNATION = sqlite_insert(incarnations).on_conflict_do_nothing()


def _write_nodes(conn: Connection, commands: Sequence[SetNode]) -> None:
    """Node upserts, incarnations and state-change events of ``commands``, one executemany each, in order."""
    rows = [
        {"name": n.name, "incarnation": n.incarnation, "state": str(n.state), "data": node_to_dict(n)}
        for n in (c.node for c in commands)
    ]
    conn.execute(UPSERT_NODE, rows)
    conn.execute(
        ADD_INCARNATION,
        [{"node": c.node.name, "incarnation": c.node.incarnation, "registered_at": c.node.joined_at} for c in commands],
    )
    changes = [
        _event_row(c.change.at, "NodeStateChanged", c.node.job, c.node.name, _change(c.change))
        for c in commands
        if c.change
    ]
    if changes:
        conn.execute(insert(events), changes)


def _write(conn: Connection, command: Command) -> None:
    if isinstance(command, SetNode):
        _write_nodes(conn, [command])
    elif isinstance(command, SetJob):
        job = command.job
        conn.execute(jobs.update().where(jobs.c.id == job.id).values(state=str(job.state), data=job_to_dict(job)))
        if command.change:
            _event(conn, command.change.at, "JobStateChanged", job.id, None, _change(command.change))
    elif isinstance(command, StartGeneration):
        layout = command.layout
        conn.execute(
            insert(generations).values(
                job=command.job_id,
                generation=command.generation,
                layout=layout.to_dict(),
                resume_step=command.resume_step,
                cause=command.cause,
                morph_seconds=command.morph_seconds,
                issued_at=command.at,
            )
        )
        rows = [
            {"job": command.job_id, "generation": command.generation, "node": name, "ranks": list(ranks)}
            for name, ranks in ranks_by_node(layout).items()
        ]
        if rows:
            conn.execute(insert(assignments), rows)
        data = {"generation": command.generation, "layout": layout.describe(), "resume_step": command.resume_step}
        _event(conn, command.at, "GenerationIssued", command.job_id, None, {**data, "cause": command.cause})
    elif isinstance(command, RecordCheckpoint):
        conn.execute(
            sqlite_insert(checkpoints)
            .values(job=command.job_id, step=command.step, generation=command.generation, committed_at=command.at)
            .on_conflict_do_nothing()
        )
    elif isinstance(command, RecordEvent):
        _event(conn, command.at, command.kind, command.job, command.node, dict(command.data))


def _change(change: Any) -> dict[str, Any]:
    return {"from": change.source, "to": change.target, "cause": change.cause, "reason": change.reason}


def _event_row(at: float, kind: str, job: str | None, node: str | None, data: dict[str, Any]) -> dict[str, Any]:
    return {"at": at, "kind": kind, "job": job, "node": node, "data": json.loads(json.dumps(data))}


def _event(conn: Connection, at: float, kind: str, job: str | None, node: str | None, data: dict[str, Any]) -> None:
    conn.execute(insert(events), [_event_row(at, kind, job, node, data)])
