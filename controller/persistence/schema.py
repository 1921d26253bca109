"""The state database's tables and the migrations that bring an older file up to them.

``MIGRATIONS[i]`` takes a database at version i to version i + 1, one transaction each; a released
migration is never edited, only appended to, so any older state directory still loads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    select,
    text,
)

from controller.persistence import old_rows
from controller.persistence.dialect import add_column, json_value, upsert

SCHEMA_VERSION = 21

# Whole numbers of 64 bits in both databases: SQLite's INTEGER has them, PostgreSQL's has 32 (steps and byte
# offsets an agent reports, ids and decision numbers that only grow pass 2**31). SQLite's columns stay INTEGER,
# which also keeps an INTEGER PRIMARY KEY SQLite's rowid.
INT = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()
meta = Table("meta", metadata, Column("key", String, primary_key=True), Column("value", String, nullable=False))
nodes = Table(
    "nodes",
    metadata,
    Column("name", String, primary_key=True),
    Column("incarnation", INT, nullable=False),
    Column("state", String, nullable=False),
    Column("data", JSON, nullable=False),
)
incarnations = Table(
    "incarnations",
    metadata,
    Column("node", String, primary_key=True),
    Column("incarnation", INT, primary_key=True),
    Column("registered_at", Float, nullable=False),
)
jobs = Table(
    "jobs",
    metadata,
    Column("id", String, primary_key=True),
    Column("state", String, nullable=False),
    Column("seq", INT, nullable=False),
    Column("data", JSON, nullable=False),
)
generations = Table(
    "generations",
    metadata,
    Column("job", String, primary_key=True),
    Column("generation", INT, primary_key=True),
    Column("layout", JSON, nullable=False),
    Column("resume_step", INT, nullable=False),
    Column("cause", String, nullable=False),  # in words, as the API shows it
    Column("morph_seconds", Float),
    Column("issued_at", Float, nullable=False),
    Column("morph_cause", String),  # a MorphCause value; added by _v3 (nullable, as SQLite adds columns)
    Column("pause_seconds", Float),  # the pause training felt (added by _v5; NULL until the first step)
    Column("stalled_seconds", Float),  # of it, until the first step began (added by _v11; NULL: unsaid)
    Column("held_step", INT),  # taken from the previous generation's memory (added by _v13; NULL/0: none)
)
assignments = Table(
    "assignments",
    metadata,
    Column("job", String, primary_key=True),
    Column("generation", INT, primary_key=True),
    Column("node", String, primary_key=True),
    Column("ranks", JSON, nullable=False),
)
checkpoints = Table(
    "checkpoints",
    metadata,
    Column("job", String, primary_key=True),
    Column("step", INT, primary_key=True),
    Column("generation", INT, nullable=False),
    Column("committed_at", Float, nullable=False),
)
idempotency_keys = Table(  # the primary key makes a key name one job at most
    "idempotency_keys",
    metadata,
    Column("key", String, primary_key=True),
    Column("job", String, nullable=False),
)
events = Table(
    "events",
    metadata,
    Column("seq", INT, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("kind", String, nullable=False),
    Column("job", String),
    Column("node", String),
    Column("data", JSON, nullable=False),
    Column("decision", INT),  # the committed decision that wrote it (added by _v8; NULL before)
)
decisions = Table(  # what triggered each committed decision (added by _v14: older decisions have no row)
    "decisions",
    metadata,
    Column("decision", INT, primary_key=True),
    Column("stimulus", JSON, nullable=False),  # a controller.core.stimulus.Stimulus as plain data
    Column("epoch", INT),  # the leader's lease epoch that committed it (added by _v17; NULL before)
)
# The leader lease (controller.core.leadership): one row per lease name; ``expires_at`` in the database's clock.
leases = Table(
    "leases",
    metadata,
    Column("name", String, primary_key=True),
    Column("holder", String, nullable=False),  # one controller process: its address and a random suffix
    Column("address", String, nullable=False),  # where agents and clients reach it
    Column("epoch", INT, nullable=False),  # the fencing token: +1 on every change of holder
    Column("expires_at", Float, nullable=False),
)
# Secrets every controller of the database shares: the node secret and the operator and reader tokens.
secrets = Table(
    "secrets",
    metadata,
    Column("name", String, primary_key=True),
    Column("value", String, nullable=False),
)

# Trainer logs (controller/core/logs.py): each rank's stream (how many bytes the controller has, the start of an
# unfinished line), the lines (the id is the cursor: AUTOINCREMENT never hands out an id again, even once the
# newest rows were deleted) and each job's totals, which bound what it keeps.
pools = Table(  # each capacity pool's history as the forecast counts it (added by _v19)
    "pools",
    metadata,
    Column("kind", String, primary_key=True),  # a scheduler.pools.PoolKind value
    Column("data", JSON, nullable=False),  # scheduler.forecast.PoolStats.to_dict()
)
log_streams = Table(
    "log_streams",
    metadata,
    Column("job", String, primary_key=True),
    Column("generation", INT, primary_key=True),
    Column("rank", INT, primary_key=True),
    Column("node", String, nullable=False),
    Column("offset", INT, nullable=False),
    Column("pending", LargeBinary, nullable=False),
    Column("cut", INT, nullable=False),
)
log_lines = Table(
    "log_lines",
    metadata,
    Column("id", INT, primary_key=True),
    Column("job", String, nullable=False),
    Column("generation", INT, nullable=False),
    Column("rank", INT, nullable=False),
    Column("node", String, nullable=False),
    Column("at", Float, nullable=False),
    Column("text", String, nullable=False),
    Column("size", INT, nullable=False),  # bytes of text, counted against the job's bound
    Index("log_lines_by_job", "job", "id"),
    sqlite_autoincrement=True,
)
log_jobs = Table(
    "log_jobs",
    metadata,
    Column("job", String, primary_key=True),
    Column("lines", INT, nullable=False),
    Column("size", INT, nullable=False),
)


class StoreError(RuntimeError):
    """The state directory cannot be used (newer schema, unreadable file); the message says what to do."""


def _v1(conn: Connection) -> None:
    metadata.create_all(conn)


def _v2(conn: Connection) -> None:
    conn.execute(text("CREATE INDEX IF NOT EXISTS events_by_job ON events (job, seq)"))


def _v3(conn: Connection) -> None:
    """Morph causes as a label beside their words: generations get a column, job rows a detail field."""
    add_column(conn, "generations", "morph_cause", "VARCHAR")
    untagged = conn.execute(text("SELECT job, generation, cause FROM generations WHERE morph_cause IS NULL")).all()
    if untagged:
        conn.execute(
            text("UPDATE generations SET morph_cause = :cause WHERE job = :job AND generation = :generation"),
            [{"job": j, "generation": g, "cause": str(old_rows.legacy_morph_cause(words))} for j, g, words in untagged],
        )
    for job_id, raw in conn.execute(text("SELECT id, data FROM jobs")).all():
        data = json_value(raw)
        if "morph_detail" in data:
            continue
        words = data.get("morph_cause") or ""
        data.update(morph_detail=words, morph_cause=str(old_rows.legacy_morph_cause(words)) if words else None)
        conn.execute(text("UPDATE jobs SET data = :data WHERE id = :id"), {"id": job_id, "data": json.dumps(data)})


GENERATED_NAME = re.compile(r"node-([0-9]{1,9})")  # longer numbers would make names past 63 characters


def _v4(conn: Connection) -> None:
    """Idempotency keys of submissions; generated node names counted, no longer derived from the largest one."""
    metadata.create_all(conn, tables=[idempotency_keys])
    if conn.execute(select(meta.c.value).where(meta.c.key == "node_seq")).scalar() is None:
        names = conn.execute(select(nodes.c.name)).scalars()
        found = [int(m.group(1)) for m in map(GENERATED_NAME.fullmatch, names) if m]
        conn.execute(meta.insert().values(key="node_seq", value=str(max(found, default=0))))


def _v5(conn: Connection) -> None:
    """The pause a morph caused, beside its decision time (older generations have none: NULL)."""
    add_column(conn, "generations", "pause_seconds", "FLOAT")


def _v6(conn: Connection) -> None:
    """Trainer logs: streams, lines (indexed by job and cursor) and per-job totals; older jobs have none."""
    metadata.create_all(conn, tables=[log_streams, log_lines, log_jobs])  # _v1 made them in a database born at v6


def _v7(conn: Connection) -> None:
    """A job's events of one kind, newest first, without a walk through its others (the dashboard's curves)."""
    conn.execute(text("CREATE INDEX IF NOT EXISTS events_by_job_kind ON events (job, kind, seq)"))


def _v8(conn: Connection) -> None:
    """Each event names the decision (one committed reconcile pass) that wrote it: why did that happen."""
    add_column(conn, "events", "decision", "INTEGER")
    conn.execute(text("CREATE INDEX IF NOT EXISTS events_by_decision ON events (decision, seq)"))


def _rewrite(conn: Connection, table: str, key: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Every row's ``data`` of ``table`` (keyed by ``key``: a name of the schema's, never input) through ``change``."""
    for found, raw in conn.execute(text(f"SELECT {key}, data FROM {table}")).all():
        conn.execute(
            text(f"UPDATE {table} SET data = :data WHERE {key} = :key"),
            {"key": found, "data": json.dumps(change(json_value(raw)))},
        )


def _v9(conn: Connection) -> None:
    """Every job and node row complete: the codec reads rows strictly, history lives in migrations only."""
    _rewrite(conn, "jobs", "id", old_rows.complete_job_row)
    _rewrite(conn, "nodes", "name", old_rows.complete_node_row)


def _v10(conn: Connection) -> None:
    """Morph state, exclusions, the salvage hold and measurements as records of their own in each job row."""
    _rewrite(conn, "jobs", "id", old_rows.nest_job_row)


def _v11(conn: Connection) -> None:
    """Of a morph's pause, the time no rank could step (older generations have none: NULL)."""
    add_column(conn, "generations", "stalled_seconds", "FLOAT")


def _v12(conn: Connection) -> None:
    """Node rows gain when a salvage suspected the node and when its name was last taken by another VM."""
    _rewrite(conn, "nodes", "name", lambda row: {**old_rows.NODE_FIELDS_V12, **row})


def _v13(conn: Connection) -> None:
    """Generations keep the step they took from their predecessors' memory: the step they resumed at is the
    larger of it and their checkpoint's, one definition for every surface. Older rows get it from their
    ``GenerationIssued`` event where retention kept it (none: the checkpoint's step, as those rows showed)."""
    add_column(conn, "generations", "held_step", "INTEGER")
    issued = conn.execute(select(events.c.job, events.c.data).where(events.c.kind == "GenerationIssued")).all()
    held = [
        {"job": job, "generation": data["generation"], "held": data["held_step"]}
        for job, data in issued
        if isinstance(data, dict) and isinstance(data.get("held_step"), int) and isinstance(data.get("generation"), int)
    ]
    if held:
        conn.execute(
            text("UPDATE generations SET held_step = :held WHERE job = :job AND generation = :generation"), held
        )


def _v14(conn: Connection) -> None:
    """Each decision keeps what triggered it (a timer, a call, the provider): why did the controller decide then."""
    metadata.create_all(conn, tables=[decisions])


def _v15(conn: Connection) -> None:
    """A job's resume, held and newest checkpoints each one (step, generation) record, a CheckpointRef."""
    refs = {n: {"step": f"{n}_step", "generation": f"{n}_generation"} for n in ("resume", "held", "last_checkpoint")}
    _rewrite(conn, "jobs", "id", lambda row: old_rows.nest_job_row(row, refs))


def _v16(conn: Connection) -> None:
    """One meaning for "hold", training state kept in memory (docs/DESIGN.md, Glossary): a flapping node's wait in
    JOINING is a quarantine (node rows' ``quarantined_until``; events ``NodeQuarantined``, their data saying
    ``quarantine_seconds``), and a job's record of its salvage is ``salvage``."""
    _rewrite(conn, "nodes", "name", lambda row: old_rows.renamed(row, "held_until", "quarantined_until"))
    _rewrite(conn, "jobs", "id", lambda row: old_rows.renamed(row, "hold", "salvage"))
    flapped = conn.execute(select(events.c.seq, events.c.data).where(events.c.kind == "NodeHeld")).all()
    quarantined = [{"seq": seq, "data": json.dumps(_quarantine_data(data))} for seq, data in flapped]
    if quarantined:
        conn.execute(text("UPDATE events SET kind = 'NodeQuarantined', data = :data WHERE seq = :seq"), quarantined)


def _quarantine_data(data: Any) -> Any:
    """A ``NodeHeld`` event's data as ``NodeQuarantined`` says it; data that is no object keeps its words (its
    reader refuses it, naming the kind, as before)."""
    return old_rows.renamed(data, "hold_seconds", "quarantine_seconds") if isinstance(data, dict) else data


def _v17(conn: Connection) -> None:
    """Controllers that share a database: a leader lease, shared secrets, each decision's epoch (docs/controller.md,
    "Two controllers")."""
    metadata.create_all(conn, tables=[leases, secrets])
    add_column(conn, "decisions", "epoch", "INTEGER")


def _v18(conn: Connection) -> None:
    """Node rows gain the eviction risk the cloud warned of (docs/controller.md, "Morphs")."""
    _rewrite(conn, "nodes", "name", lambda row: {**old_rows.NODE_FIELDS_V18, **row})


def _v19(conn: Connection) -> None:
    """The scheduler (docs/DESIGN.md, "Scheduler"): each pool's history; node rows gain their pool and the job an
    on-demand node serves, job rows their on-demand hold and what the planner learned from their step times."""
    metadata.create_all(conn, tables=[pools])
    _rewrite(conn, "nodes", "name", lambda row: {**old_rows.NODE_FIELDS_V19, **row})
    _rewrite(conn, "jobs", "id", lambda row: {**old_rows.JOB_FIELDS_V19, **row})


def _v20(conn: Connection) -> None:
    """Job rows keep when a job began waiting with no GPUs and when it last got some: the scheduler's aging."""
    _rewrite(conn, "jobs", "id", lambda row: {**old_rows.JOB_FIELDS_V20, **row})


def _v21(conn: Connection) -> None:
    """A job's morph keeps the nodes a shrink leaves it (reconcile.sharing), its on-demand hold the GPU-seconds of
    the nodes it gave back (status's cost in all): none in rows written before."""
    _rewrite(conn, "jobs", "id", old_rows.with_keep_only)


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (
    _v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9, _v10, _v11, _v12, _v13, _v14, _v15, _v16, _v17, _v18, _v19, _v20,
    _v21,
)  # fmt: skip
assert len(MIGRATIONS) == SCHEMA_VERSION


def version(conn: Connection) -> int:
    if not conn.dialect.has_table(conn, "meta"):
        return 0
    value = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    return int(value) if value is not None else 0


MIGRATION_LOCK = 0x5370_6D6F  # PostgreSQL advisory lock: one controller migrates, the others wait for it


def migrate(engine: Engine, migrations: Sequence[Callable[[Connection], None]] = MIGRATIONS) -> int:
    """Bring the schema to the newest version, one transaction per step; refuse a newer database. Controllers
    that start together on one PostgreSQL database take turns (an advisory lock held for the whole walk)."""
    if engine.dialect.name != "postgresql":
        return _migrate(engine, migrations)
    with engine.connect() as lock:
        lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
        lock.commit()
        try:
            return _migrate(engine, migrations)
        finally:
            lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
            lock.commit()


def _migrate(engine: Engine, migrations: Sequence[Callable[[Connection], None]]) -> int:
    with engine.begin() as conn:
        current = version(conn)
    if current > len(migrations):
        raise StoreError(
            f"the state database is at schema version {current}, newer than this controller's "
            f"{len(migrations)}; upgrade spotmorph or point --state-dir elsewhere"
        )
    for step in range(current, len(migrations)):
        with engine.begin() as conn:
            migrations[step](conn)
            upsert(conn, meta, ["key"], {"key": "schema_version", "value": str(step + 1)})
    return len(migrations)
