"""What differs between the two stores, SQLite and PostgreSQL, said once: upserts, new columns, the time, how
PostgreSQL's connections give up on a partition.

Everything else the store writes is SQLAlchemy Core that both speak. ``conn.dialect.name`` picks; a third
dialect is refused by name, not half supported.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Table, inspect, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

DIALECTS = ("sqlite", "postgresql")

# libpq: give up on a connection that cannot be opened, or whose sent data goes unacknowledged (a partition),
# within seconds: a leader cut off from its database must fail its writes before its lease runs out.
POSTGRES_CONNECT = {"connect_timeout": 3, "tcp_user_timeout": 3000, "keepalives_idle": 5, "keepalives_interval": 2}
# The server's side: a session left idle inside a transaction is ended, and its locks released, after this. A
# controller cut off mid-transaction (its lease fence's FOR SHARE, a renewal's FOR UPDATE on the lease row) is
# silent, not gone, to the server, which would hold the row lock for hours (its keepalives), and the standby's
# take of the lease would wait on it as long (tests/ha/test_partition.py). No transaction of the store waits
# between its statements: each runs its statements back to back, but a controller starved of CPU (a loaded host)
# may pause between two of them for seconds, and must not lose its connection for it: 15 s, so a takeover behind a
# cut-off transaction waits at most that long.
POSTGRES_SESSION_OPTIONS = "-c idle_in_transaction_session_timeout=15000"


def postgres_connect_args(url: str) -> dict[str, object]:
    """libpq's parameters for the store's connections: the timeouts, and the session options before any the URL
    gives (``?options=...``: connect_args would replace them; a setting given there wins, coming later)."""
    given = make_url(url).query.get("options")
    given = given[-1] if isinstance(given, tuple) else given
    options = f"{POSTGRES_SESSION_OPTIONS} {given}" if given else POSTGRES_SESSION_OPTIONS
    return {**POSTGRES_CONNECT, "options": options}


class UnknownDialect(ValueError):
    """A database spotmorph's store does not speak."""


def insert(conn: Connection, table: Table) -> Any:
    """The dialect's INSERT that takes ``on_conflict_do_update``/``on_conflict_do_nothing`` (both have it)."""
    name = conn.dialect.name
    if name == "sqlite":
        return sqlite.insert(table)
    if name == "postgresql":
        return postgresql.insert(table)
    raise UnknownDialect(f"database dialect {name!r}: spotmorph stores its state in {' or '.join(DIALECTS)}")


def upsert(conn: Connection, table: Table, keys: list[str], values: dict[str, Any]) -> None:
    """``values`` into ``table``, replacing the columns outside ``keys`` of a row that has those keys."""
    statement = insert(conn, table).values(**values)
    conn.execute(
        statement.on_conflict_do_update(index_elements=keys, set_={k: values[k] for k in values if k not in keys})
    )


def add_column(conn: Connection, table: str, column: str, sql_type: str) -> None:
    """``column`` added to ``table`` unless it is there (a database born at a later version has it already).
    The names are the schema's constants, never input."""
    if column not in {c["name"] for c in inspect(conn).get_columns(table)}:
        conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))


def json_value(raw: Any) -> Any:
    """A JSON column read through ``text()``: SQLite hands back the text, PostgreSQL the value."""
    return json.loads(raw) if isinstance(raw, str | bytes) else raw


def now_sql(conn: Connection) -> str:
    """The database's clock in Unix seconds, as SQL (a constant of this module's, never input)."""
    if conn.dialect.name == "postgresql":
        return "EXTRACT(EPOCH FROM clock_timestamp())"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def database_now(conn: Connection) -> float:
    """The database's clock in Unix seconds: every controller measures a lease against the same clock."""
    if conn.dialect.name == "postgresql":
        return float(conn.execute(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")).scalar_one())
    return float(conn.execute(text("SELECT (julianday('now') - 2440587.5) * 86400.0")).scalar_one())
