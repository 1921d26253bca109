"""The throwaway PostgreSQL server the store's tests run against (spotmorph/local/postgres.py): it comes up
reachable over TCP and its socket, its databases are apart, and nothing of it outlives it, even its owner's
SIGKILL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from spotmorph.local.processes import alive, wait_for
from tests.postgres import MISSING, PostgresServer, default_parent, find_binaries, sweep_stale


def _binaries() -> Path:
    binaries = find_binaries()
    if binaries is None:
        pytest.skip(MISSING)
    return binaries


def _scalar(url: str, query: str) -> object:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.text(query)).scalar_one()
    finally:
        engine.dispose()


def test_the_server_accepts_connections_over_tcp_and_its_socket(postgres_server: PostgresServer) -> None:
    url = postgres_server.url()
    assert url == f"postgresql+psycopg://postgres@127.0.0.1:{postgres_server.port}/postgres"
    assert _scalar(url, "SELECT current_user") == "postgres"
    assert _scalar(postgres_server.socket_url(), "SELECT inet_server_addr() IS NULL") is True  # a unix socket
    assert _scalar(url, "SHOW fsync") == "off"
    assert postgres_server.version >= 100000


def test_two_databases_are_independent(postgres_server: PostgresServer) -> None:
    first, second = postgres_server.unique_name("apart"), postgres_server.unique_name("apart")
    first_url, second_url = postgres_server.create_database(first), postgres_server.create_database(second)
    engine = sa.create_engine(first_url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE nodes (name text)"))
            connection.execute(sa.text("INSERT INTO nodes VALUES ('a')"))
    finally:
        engine.dispose()
    assert _scalar(first_url, "SELECT count(*) FROM nodes") == 1
    assert _scalar(second_url, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'") == 0
    postgres_server.drop_database(first)
    postgres_server.drop_database(second)
    assert _scalar(postgres_server.url(), f"SELECT count(*) FROM pg_database WHERE datname = '{first}'") == 0


def test_postgres_url_is_a_fresh_empty_database(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    assert _scalar(postgres_url, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'") == 0


def test_store_target_is_a_sqlite_file_or_a_database_url(store_target: Path | str, tmp_path: Path) -> None:
    if isinstance(store_target, Path):
        assert store_target == tmp_path / "state.db"
        assert not store_target.exists()
    else:
        assert store_target.startswith("postgresql+psycopg://")


def test_stop_leaves_no_process_and_no_directory() -> None:
    server = PostgresServer.start(_binaries())
    postmaster = server.pid
    directory = server.directory
    connection = server.connect()  # a backend, which a fast shutdown ends too
    backend = connection.info.backend_pid
    assert alive(postmaster) and alive(backend) and directory.is_dir()
    server.stop()
    server.stop()  # idempotent: the fixture's exit and atexit may both call it
    connection.close()
    assert not alive(postmaster) and not alive(backend)
    assert not directory.exists()
    assert server.pid is None


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv (util-linux): no death signal to test")
def test_a_server_dies_with_its_killed_owner_and_its_directory_is_swept() -> None:
    """A test session killed (SIGKILL: no atexit) takes its server along; the next start removes its directory."""
    binaries = _binaries()
    owner = textwrap.dedent(f"""
        import json, os, pathlib, signal
        from spotmorph.local.postgres import PostgresServer
        server = PostgresServer.start(pathlib.Path({str(binaries)!r}))
        print(json.dumps({{"pid": server.pid, "directory": str(server.directory)}}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", owner], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9, done.stderr
    started = json.loads(done.stdout)
    directory = Path(started["directory"])
    wait_for(lambda: not alive(started["pid"]), 30, "the orphaned postmaster to shut down", poll=0.05)
    assert directory.exists()
    sweep_stale(default_parent())
    assert not directory.exists()
