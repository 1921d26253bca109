"""PostgreSQL for the tests and the benchmarks: the server (:class:`PostgresServer`) lives in
spotmorph/local/postgres.py, where ``spotmorph local up --database`` reaches it too; this module says why the
PostgreSQL tests skip on a machine without it. The fixtures are in tests/conftest.py: ``postgres_server`` (one
per xdist worker), ``postgres_url`` (a fresh database per test) and ``store_target`` (SQLite, then PostgreSQL).
"""

from __future__ import annotations

from spotmorph.local.postgres import PostgresError, PostgresServer, default_parent, find_binaries, sweep_stale

__all__ = ["MISSING", "PostgresError", "PostgresServer", "default_parent", "find_binaries", "sweep_stale"]

MISSING = (
    "no PostgreSQL here (initdb and postgres in neither PATH nor /usr/lib/postgresql/*/bin): "
    "`make install-dev` as root installs Debian's postgresql, or `apt-get install postgresql`"
)
