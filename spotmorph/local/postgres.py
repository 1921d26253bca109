"""A throwaway PostgreSQL server: ``initdb`` in a fresh temporary directory, ``postgres`` on a free port.

The tests run the controller's store against it (tests/conftest.py: ``postgres_server``), the benchmarks
measure it, and ``spotmorph local up --database`` may start one for its controllers. It is tuned for speed,
never for durability (no fsync, trust authentication): nothing it holds outlives it.

No server is left behind: :meth:`PostgresServer.stop` runs at exit, and where util-linux's ``setpriv`` is
found the postmaster gets SIGQUIT (immediate shutdown) when the thread that started it dies, even by
SIGKILL; a directory such a death left behind is removed by the next server started in the same parent.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from spotmorph.local.processes import alive, free_port, log_tail

PREFIX = "spotmorph-postgres-"  # the temporary directories' names; a stale one is swept by this prefix
OWNER_FILE = "owner.pid"  # the pid of the process that started the server, to tell a stale directory
SUPERUSER = "postgres"  # the database's superuser, whatever OS user runs the server
OS_USER = "postgres"  # the OS user that runs the server when we are root (postgres refuses to run as root)
DEBIAN_BIN = Path("/usr/lib/postgresql")
# Speed over durability: the data lives as long as one test session. Each can be overridden (``settings``).
FAST_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "16MB",
    "max_connections": "200",  # a test's pools and several controllers on one server
    "autovacuum": "off",  # the suite is bound by the CPU; tables here live seconds
    "log_min_messages": "warning",
}
SHM_ROOM = 1 << 30  # /dev/shm holds a server when this much is free (Docker's default 64 MB is not enough)
BIND_FAILED = re.compile(r"could not (bind|create listen socket)|Address already in use")
PORT_TRIES = 3  # a free port taken between choosing it and binding it: try another


class PostgresError(RuntimeError):
    """The server could not be set up or did not come up; the message quotes the tail of its log."""


def find_binaries() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``: PATH's first, else Debian's newest version.

    Debian keeps the server's programs out of PATH (/usr/lib/postgresql/<version>/bin); PATH may hold a
    link to one of them, so the link is resolved to find its sibling ``postgres``."""
    found = shutil.which("initdb")
    if found is not None:
        directory = Path(found).resolve().parent
        if (directory / "postgres").exists():
            return directory
    versions = []
    with contextlib.suppress(OSError):
        for entry in DEBIAN_BIN.iterdir():
            if (entry / "bin" / "initdb").exists() and (entry / "bin" / "postgres").exists():
                versions.append((_version_key(entry.name), entry / "bin"))
    return max(versions)[1] if versions else None


def default_parent() -> Path:
    """/dev/shm where it is a memory file system with room, else the temporary directory: creating a database
    copies its template's 8 MB, 10 ms in memory against 150 ms on this machine's disk (fsync off in both)."""
    shm = Path("/dev/shm")
    try:
        room = os.statvfs(shm)
    except OSError:
        return Path(tempfile.gettempdir())
    if os.access(shm, os.W_OK | os.X_OK) and room.f_bavail * room.f_frsize >= SHM_ROOM:
        return shm
    return Path(tempfile.gettempdir())


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name))


class PostgresServer:
    """One running PostgreSQL server in a temporary directory of its own; :meth:`stop` removes both.

    Start one with :meth:`start` (or ``with PostgresServer.start() as server``). It listens on a unix socket in
    its directory and on ``listen_addresses`` (loopback by default; a namespace test may add its bridge's
    address, or pass none for the socket only) at one free TCP port, and trusts every connection."""

    def __init__(self, binaries: Path, directory: Path, port: int, listen_addresses: Sequence[str]) -> None:
        self.binaries = binaries
        self.directory = directory
        self.port = port
        self.listen_addresses = tuple(listen_addresses)
        self.data = directory / "data"
        self.log = directory / "server.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._databases = 0
        self._owner = os.getpid()  # a forked child inherits this object and its atexit entry, not the server
        self.version = 0  # the server's version as a number (150018 for 15.18), once it accepts connections

    @classmethod
    def start(
        cls,
        binaries: Path | None = None,
        *,
        listen_addresses: Sequence[str] = ("127.0.0.1",),
        settings: Mapping[str, str] | None = None,
        parent: Path | None = None,
        timeout: float = 60.0,
    ) -> PostgresServer:
        """Initialise a cluster in a fresh directory under ``parent`` (:func:`default_parent`) and
        start it; returns once it accepts connections. :class:`PostgresError` when there are no binaries or it
        does not come up within ``timeout`` seconds (nothing is left behind then)."""
        binaries = binaries or find_binaries()
        if binaries is None:
            raise PostgresError("no PostgreSQL binaries (initdb, postgres) in PATH nor in /usr/lib/postgresql/*/bin")
        base = parent or default_parent()
        sweep_stale(base)
        directory = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
        (directory / OWNER_FILE).write_text(str(os.getpid()))
        server = cls(binaries, directory, 0, listen_addresses)
        atexit.register(server.stop)
        try:
            server._initdb(timeout)
            server._launch(dict(FAST_SETTINGS, **(settings or {})), time.monotonic() + timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def host(self) -> str:
        """The address clients reach it at over TCP (loopback when it listens on every address)."""
        if not self.listen_addresses:
            raise PostgresError("this server listens on its unix socket only: use socket_url()")
        first = self.listen_addresses[0]
        return "127.0.0.1" if first in ("*", "0.0.0.0", "::") else first

    def url(self, dbname: str = "postgres") -> str:
        """SQLAlchemy's URL for ``dbname`` over TCP, as another machine (or network namespace) would reach it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql+psycopg://{SUPERUSER}@{host}:{self.port}/{dbname}"

    def socket_url(self, dbname: str = "postgres") -> str:
        """SQLAlchemy's URL for ``dbname`` over the unix socket in the server's directory."""
        return f"postgresql+psycopg://{SUPERUSER}@/{dbname}?host={self.directory}&port={self.port}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[TupleRow]:
        """A psycopg connection in autocommit mode over the unix socket (for setup, not for the store)."""
        return psycopg.connect(host=str(self.directory), port=self.port, user=SUPERUSER, dbname=dbname, autocommit=True)

    def create_database(self, name: str, template: str = "template0") -> str:
        """A fresh, empty database ``name`` (copied from ``template``); returns its :meth:`url`.

        From PostgreSQL 15 the copy is a file copy and a checkpoint, which is cheaper here (no fsync) than
        writing every block of the template to the WAL (15's default)."""
        query = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        if self.version >= 150000:
            query = sql.SQL("{} STRATEGY FILE_COPY").format(query)
        with self.connect() as connection:
            connection.execute(query)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, disconnecting its clients first (a test's leftover pools): a server in memory
        (/dev/shm) holds every database it keeps."""
        query = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
        if self.version >= 130000:
            query = sql.SQL("{} WITH (FORCE)").format(query)
        with self.connect() as connection:
            connection.execute(query)

    def unique_name(self, prefix: str = "db") -> str:
        """A database name not handed out before by this server (for :meth:`create_database`)."""
        self._databases += 1
        return f"{prefix}_{self._databases}"

    def stop(self, grace: float = 10.0) -> None:
        """Fast shutdown (SIGINT: clients disconnected, no waiting for them), SIGKILL to the server's process
        group after ``grace`` seconds; then remove the directory. Idempotent; registered to run at exit."""
        atexit.unregister(self.stop)
        if os.getpid() != self._owner:
            return
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()  # the backends went with it: they share its process group
        shutil.rmtree(self.directory, ignore_errors=True)

    def _initdb(self, timeout: float) -> None:
        """``initdb`` as the server's OS user: trust for everyone, UTF-8 in the C locale, no fsync."""
        self._own(self.directory)
        args = [str(self.binaries / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-A", "trust"]
        args += ["-E", "UTF8", "--locale=C", "--no-sync"]
        with open(self.log, "ab") as log:
            try:
                who = _identity()
                done = subprocess.run(
                    args,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    cwd=self.directory,
                    user=who.user,
                    group=who.group,
                    extra_groups=who.extra_groups,
                )
            except subprocess.TimeoutExpired as error:
                raise PostgresError(f"initdb ran past {timeout:.0f} s\n{log_tail(self.log)}") from error
        if done.returncode != 0:
            raise PostgresError(f"initdb failed ({done.returncode})\n{log_tail(self.log)}")
        # Any address may connect: a namespace test reaches the server from its own subnet.
        hba = "local all all trust\nhost all all 0.0.0.0/0 trust\nhost all all ::/0 trust\n"
        (self.data / "pg_hba.conf").write_text(hba)
        self._own(self.data / "pg_hba.conf")

    def _launch(self, settings: Mapping[str, str], deadline: float) -> None:
        """Start ``postgres`` on a free port (another when that one was taken meanwhile) and wait until it
        accepts connections."""
        for attempt in range(PORT_TRIES):
            self.port = free_port()
            self._process = self._spawn(settings)
            try:
                self._wait_ready(deadline)
                return
            except PostgresError:
                bind_failed = self._process.poll() is not None and BIND_FAILED.search(log_tail(self.log, 4000))
                if not bind_failed or attempt == PORT_TRIES - 1:
                    raise
                self._process = None

    def _spawn(self, settings: Mapping[str, str]) -> subprocess.Popen[bytes]:
        args = [str(self.binaries / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.directory)]
        options = dict(settings, listen_addresses=",".join(self.listen_addresses))
        for key, value in options.items():
            args += ["-c", f"{key}={value}"]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:  # SIGQUIT when our thread dies, even by SIGKILL, where atexit never runs
            args = [setpriv, "--pdeathsig", "SIGQUIT", *args]
        who = _identity()
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,  # its own process group, to kill with its backends; no terminal's Ctrl-C
                user=who.user,
                group=who.group,
                extra_groups=who.extra_groups,
            )

    def _wait_ready(self, deadline: float) -> None:
        """Connect over the socket until one succeeds: the listeners are all open before the first connection
        is accepted, and one is refused while the server starts up."""
        process = self._process
        assert process is not None
        while True:
            if process.poll() is not None:
                raise PostgresError(f"postgres exited ({process.returncode})\n{log_tail(self.log)}")
            try:
                with psycopg.connect(
                    host=str(self.directory), port=self.port, user=SUPERUSER, dbname="postgres", connect_timeout=5
                ) as connection:
                    self.version = connection.info.server_version
                    return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    raise PostgresError(f"postgres did not accept connections: {error}\n{log_tail(self.log)}") from None
            time.sleep(0.02)

    def _own(self, path: Path) -> None:
        """Hand ``path`` to the server's OS user when we are root (a no-op otherwise)."""
        who = _identity()
        if who.user is not None:
            os.chown(path, who.user, -1 if who.group is None else who.group)


class _Identity(NamedTuple):
    """Popen's ``user``, ``group`` and ``extra_groups``: ``postgres`` when we are root (postgres refuses to run
    as root), else ours (all None)."""

    user: int | None = None
    group: int | None = None
    extra_groups: list[int] | None = None


def _identity() -> _Identity:
    if os.geteuid() != 0:
        return _Identity()
    try:
        user = pwd.getpwnam(OS_USER)
    except KeyError:
        raise PostgresError(f"running as root, and there is no `{OS_USER}` OS user to run the server as") from None
    return _Identity(user.pw_uid, user.pw_gid, [])


def sweep_stale(parent: Path) -> None:
    """Remove the directories under ``parent`` whose owner died without stopping its server (SIGKILL): the
    server died with it (``setpriv``'s death signal). A directory whose server still runs is left."""
    with contextlib.suppress(OSError):
        for entry in parent.glob(f"{PREFIX}*"):
            try:
                owner = int((entry / OWNER_FILE).read_text())
            except (OSError, ValueError):
                continue  # being set up right now, or not ours
            if alive(owner):
                continue
            try:
                server = int((entry / "data" / "postmaster.pid").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                server = None
            if not alive(server):
                shutil.rmtree(entry, ignore_errors=True)
