"""The persistent store: SQLite in WAL mode, or PostgreSQL, through SQLAlchemy Core; a versioned schema, an event log.

Everything the controller needs after ``kill -9`` is here: nodes and their incarnations, jobs with
their specs, every generation issued with its assignments (a primary key makes issuing a generation
twice impossible), committed checkpoints, and an append-only event log. Commands from reconcile are
written in one transaction, so a crash leaves either all of a decision or none of it. Tables and
migrations live in :mod:`.schema`, the mapping of records to rows in :mod:`.codec`, what differs between
the two databases in :mod:`.dialect`. Once a controller holds the lease (:mod:`.leases`), every write
transaction first checks that it still does: a deposed controller's write fails with :class:`Deposed`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, assert_never

from sqlalchemy import Connection, Engine, create_engine, event, func, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from controller.core.events import EventKind
from controller.core.leadership import Lease
from controller.core.logs import LogChunk, LogLine
from controller.core.model import (
    AddJob,
    Command,
    ForgetNode,
    JobRecord,
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
    ranks_by_node,
)
from controller.core.stimulus import Stimulus
from controller.eventlog.fact import Fact
from controller.eventlog.facts import (
    JobActionChanged,
    JobStateChanged,
    JobSubmitted,
    NodeStateChanged,
)
from controller.persistence import leases as lease_rows
from controller.persistence import logs as log_rows
from controller.persistence.codec import (
    EventRow,
    GenerationRow,
    changed,
    event_from_row,
    event_row,
    generation_from_row,
    generation_issued,
    job_from_dict,
    job_to_dict,
    node_from_dict,
    node_row,
    stimulus_to_dict,
)
from controller.persistence.dialect import insert as upsert_into
from controller.persistence.dialect import postgres_connect_args, upsert
from controller.persistence.leases import Deposed
from controller.persistence.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    StoreError,
    assignments,
    checkpoints,
    decisions,
    events,
    generations,
    idempotency_keys,
    incarnations,
    jobs,
    meta,
    migrate,
    nodes,
    pools,
    secrets,
    version,
)
from scheduler.forecast import PoolStats
from scheduler.pools import PoolKind

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Deposed",
    "EventRow",
    "GenerationRow",
    "Store",
    "StoreError",
    "migrate",
    "unavailable",
]


def unavailable(error: BaseException) -> bool:
    """The database cannot be written now (disk full, locked, an I/O error): no report's or job's doing."""
    return isinstance(error, OperationalError | sqlite3.OperationalError | OSError)


def database_url(target: Path | str) -> str:
    """The SQLAlchemy URL of ``target``: a SQLite file's path, or a ``postgresql://`` URL (psycopg 3 drives it)."""
    if isinstance(target, Path):
        return f"sqlite:///{target}"
    try:
        url = make_url(target)
    except ArgumentError as exc:
        raise StoreError(f"--database {target!r}: not a database URL; use postgresql://USER@HOST:PORT/DB") from exc
    if url.get_backend_name() != "postgresql":
        raise StoreError(
            f"--database: {url.get_backend_name()!r} is not supported; use postgresql://USER@HOST:PORT/DB "
            "(or leave --database out for the SQLite file in --state-dir)"
        )
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


class Store:
    """One database: a SQLite file (one controller) or PostgreSQL (controllers that take turns leading)."""

    def __init__(self, target: Path | str) -> None:
        self.target = target
        url = database_url(target)
        postgres = url.startswith("postgresql")
        connect_args = postgres_connect_args(url) if postgres else {}
        self.engine: Engine = create_engine(url, future=True, connect_args=connect_args, pool_pre_ping=postgres)
        if not postgres:
            event.listen(self.engine, "connect", _pragmas)
        self.fencing: Lease | None = None  # the lease this controller leads under: every write checks it
        migrate(self.engine)

    @property
    def shared(self) -> bool:
        """Several controllers may use this database (PostgreSQL); a SQLite file is one controller's."""
        return self.engine.dialect.name == "postgresql"

    def _fence(self, conn: Connection) -> None:
        if self.fencing is not None:
            lease_rows.fence(conn, self.fencing)

    def shared_secret(self, name: str, proposed: str) -> str:
        """The secret ``name`` every controller of this database uses: ``proposed`` if none had it yet."""
        with self.engine.begin() as conn:
            conn.execute(upsert_into(conn, secrets).values(name=name, value=proposed).on_conflict_do_nothing())
            return str(conn.execute(select(secrets.c.value).where(secrets.c.name == name)).scalar_one())

    def close(self) -> None:
        self.engine.dispose()

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return version(conn)

    def load(self) -> tuple[dict[str, NodeRecord], dict[str, JobRecord]]:
        with self.engine.connect() as conn:
            node_rows = conn.execute(select(nodes.c.data)).scalars()
            loaded_nodes = {n.name: n for n in map(node_from_dict, node_rows)}
            job_rows = conn.execute(select(jobs.c.data).order_by(jobs.c.seq)).scalars()
            loaded_jobs = {j.id: j for j in map(job_from_dict, job_rows)}
        return loaded_nodes, loaded_jobs

    def pools(self) -> dict[PoolKind, PoolStats]:
        """Each pool's history, as the forecast counted it (none yet: empty)."""
        with self.engine.connect() as conn:
            return {s.kind: s for s in map(PoolStats.from_dict, conn.execute(select(pools.c.data)).scalars())}

    def counters(self) -> tuple[int, int, int]:
        """(jobs submitted, node names generated, highest incarnation forgotten): where ids and incarnations go on."""
        with self.engine.connect() as conn:
            return _counter(conn, "job_seq"), _counter(conn, "node_seq"), _counter(conn, "incarnation_floor")

    def persist(self, commands: Iterable[Command], stimulus: Stimulus | None = None) -> int:
        """One transaction, one decision: its number (counted in the store) is stamped on every event it
        writes, kept with what triggered it (``stimulus``; None: nothing says, as in tests), and returned.
        Consecutive node updates (a generation issued on 1,000 nodes) are batched."""
        with self.engine.begin() as conn:
            self._fence(conn)
            decision = _counter(conn, "decision_seq") + 1
            if stimulus is not None:
                epoch = None if self.fencing is None else self.fencing.epoch
                row = {"decision": decision, "stimulus": stimulus_to_dict(stimulus), "epoch": epoch}
                conn.execute(insert(decisions).values(**row))
            batch: list[SetNode] = []
            for command in commands:
                if isinstance(command, SetNode):
                    batch.append(command)
                    continue
                if batch:
                    _write_nodes(conn, batch, decision)
                    batch = []
                _write(conn, command, decision)
            if batch:
                _write_nodes(conn, batch, decision)
            _set_counter(conn, "decision_seq", decision)
        return decision

    def event_counts(self) -> dict[str, int]:
        """How many events of each kind the log holds (for metrics)."""
        query = select(events.c.kind, func.count()).group_by(events.c.kind)
        with self.engine.connect() as conn:
            return {str(kind): int(count) for kind, count in conn.execute(query)}

    def events(
        self, after: int = 0, job: str | None = None, limit: int = 1000, decision: int | None = None
    ) -> list[EventRow]:
        query = EVENTS.where(events.c.seq > after).order_by(events.c.seq).limit(limit)
        if job is not None:
            query = query.where(events.c.job == job)
        if decision is not None:
            query = query.where(events.c.decision == decision)
        with self.engine.connect() as conn:
            return [event_from_row(r) for r in conn.execute(query)]

    def recent_events(self, job: str | None, kinds: Sequence[str] | None, limit: int) -> list[EventRow]:
        """The newest ``limit`` events (of ``job``, of ``kinds``, when given), oldest first."""
        query = EVENTS.order_by(events.c.seq.desc()).limit(limit)
        if job is not None:
            query = query.where(events.c.job == job)
        if kinds is not None:
            query = query.where(events.c.kind.in_(list(kinds)))
        with self.engine.connect() as conn:
            return [event_from_row(r) for r in reversed(list(conn.execute(query)))]

    def generations(self, job: str) -> list[GenerationRow]:
        query = select(generations).where(generations.c.job == job).order_by(generations.c.generation)
        with self.engine.connect() as conn:
            return [generation_from_row(r) for r in conn.execute(query)]

    def checkpoints(self, job: str) -> list[int]:
        query = select(checkpoints.c.step).where(checkpoints.c.job == job).order_by(checkpoints.c.step)
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def append_logs(self, node: str, chunks: Sequence[LogChunk], at: float) -> list[int]:
        """One ReportLogs in one transaction (:mod:`.logs`): the offset of each chunk's stream after it.
        Call it off the event loop, one caller at a time (log writes are not decisions)."""
        with self.engine.begin() as conn:
            self._fence(conn)
            return log_rows.append(conn, node, chunks, at)

    def log_lines(
        self, job: str, after: int = 0, rank: int | None = None, generation: int | None = None, limit: int = 1000
    ) -> list[LogLine]:
        """Up to ``limit`` of the job's log lines after the cursor ``after`` (of one rank, one generation)."""
        with self.engine.connect() as conn:
            return log_rows.read(conn, job, after, rank, generation, limit)


def _pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


# Events with the stimulus of the decision that wrote them (none before schema 14: an outer join).
EVENTS = select(events, decisions.c.stimulus).select_from(
    events.outerjoin(decisions, events.c.decision == decisions.c.decision)
)


def _write_nodes(conn: Connection, commands: Sequence[SetNode], decision: int) -> None:
    """Node upserts, incarnations and state-change events of ``commands``, one executemany each, in order."""
    upsert_node = upsert_into(conn, nodes)
    excluded = upsert_node.excluded
    columns = {"incarnation": excluded.incarnation, "state": excluded.state, "data": excluded.data}
    conn.execute(
        upsert_node.on_conflict_do_update(index_elements=["name"], set_=columns), [node_row(c.node) for c in commands]
    )
    conn.execute(
        upsert_into(conn, incarnations).on_conflict_do_nothing(),
        [{"node": c.node.name, "incarnation": c.node.incarnation, "registered_at": c.node.joined_at} for c in commands],
    )
    changes = []
    for c in commands:
        if c.change:
            fact = changed(NodeStateChanged, c.change)
            changes.append(event_row(c.change.at, fact.kind, c.node.job, c.node.name, fact.data(), decision))
    if changes:
        conn.execute(insert(events), changes)


def _counter(conn: Connection, key: str) -> int:
    return int(conn.execute(select(meta.c.value).where(meta.c.key == key)).scalar() or 0)


def _set_counter(conn: Connection, key: str, value: int) -> None:
    upsert(conn, meta, ["key"], {"key": key, "value": str(value)})


def _add_job(conn: Connection, command: AddJob, decision: int) -> None:
    """The job row, the job counter, its idempotency key (unique: a second job under it fails) and JobSubmitted."""
    job = command.job
    conn.execute(insert(jobs).values(id=job.id, state=str(job.state), seq=command.seq, data=job_to_dict(job)))
    _set_counter(conn, "job_seq", command.seq)
    if job.idempotency_key:
        conn.execute(insert(idempotency_keys).values(key=job.idempotency_key, job=job.id))
    _fact(conn, decision, job.submitted_at, JobSubmitted(job.spec.name), job.id)


def _write(conn: Connection, command: Command, decision: int) -> None:
    if isinstance(command, SetNode):
        _write_nodes(conn, [command], decision)
    elif isinstance(command, AddJob):
        _add_job(conn, command, decision)
    elif isinstance(command, SetNodeSeq):
        _set_counter(conn, "node_seq", command.seq)
    elif isinstance(command, ForgetNode):  # its incarnations and events stay: the node's history
        conn.execute(nodes.delete().where(nodes.c.name == command.node))
        _set_counter(conn, "incarnation_floor", max(_counter(conn, "incarnation_floor"), command.incarnation))
    elif isinstance(command, SetJob):
        job = command.job
        conn.execute(jobs.update().where(jobs.c.id == job.id).values(state=str(job.state), data=job_to_dict(job)))
        action = changed(JobActionChanged, command.action) if command.action else None
        if command.change:  # with the action's change when the move changed what its trainers are told too
            moved = replace(changed(JobStateChanged, command.change), action=action)
            _fact(conn, decision, command.change.at, moved, job.id)
        elif command.action:
            _fact(conn, decision, command.action.at, changed(JobActionChanged, command.action), job.id)
    elif isinstance(command, StartGeneration):
        layout = command.layout
        conn.execute(
            insert(generations).values(
                job=command.job_id,
                generation=command.generation,
                layout=layout.to_dict(),
                resume_step=command.resume.step,
                held_step=command.held.step,
                cause=command.morph_detail,
                morph_seconds=command.morph_seconds,
                issued_at=command.at,
                morph_cause=str(command.morph_cause),
            )
        )
        rows = [
            {"job": command.job_id, "generation": command.generation, "node": name, "ranks": list(ranks)}
            for name, ranks in ranks_by_node(layout).items()
        ]
        if rows:
            conn.execute(insert(assignments), rows)
        _fact(conn, decision, command.at, generation_issued(command), command.job_id)
    elif isinstance(command, RecordCheckpoint):
        conn.execute(
            upsert_into(conn, checkpoints)
            .values(job=command.job_id, step=command.step, generation=command.generation, committed_at=command.at)
            .on_conflict_do_nothing()
        )
    elif isinstance(command, RecordPause):
        where = (generations.c.job == command.job_id) & (generations.c.generation == command.generation)
        conn.execute(
            generations.update().where(where).values(pause_seconds=command.seconds, stalled_seconds=command.stalled)
        )
    elif isinstance(command, RecordEvent):
        _event(conn, decision, command.at, command.kind, command.job, command.node, dict(command.data))
    elif isinstance(command, SetPoolStats):
        upsert(conn, pools, ["kind"], {"kind": str(command.stats.kind), "data": command.stats.to_dict()})
    elif isinstance(command, ReleaseInstance | RequestCapacity):
        pass  # side effects the runner performs once persisted; their outcomes come back as events
    else:
        assert_never(command)  # a new command type must say here how it is stored


def _fact(conn: Connection, decision: int, at: float, fact: Fact, job: str | None, node: str | None = None) -> None:
    _event(conn, decision, at, fact.kind, job, node, fact.data())


def _event(
    conn: Connection,
    decision: int,
    at: float,
    kind: EventKind,
    job: str | None,
    node: str | None,
    data: dict[str, Any],
) -> None:
    conn.execute(insert(events), [event_row(at, kind, job, node, data, decision)])
