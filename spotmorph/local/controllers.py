"""A local cluster's controllers: one on its SQLite file, or several sharing a PostgreSQL database (one leads).

``up --controllers N --database URL`` starts controller 1, waits until it serves (it leads: the first to take
the lease), then the others, which stand by. They share the settings file, in which the database URL is
(mode 0600: a URL may hold a password, and a command line is visible to every user). ``kill-leader`` reads
the lease from the database, SIGKILLs the controller whose address it names and prints that address.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from controller.core.leadership import Lease
from controller.persistence import leases
from controller.persistence.store import Store, StoreError, database_url
from morphing.errors import UserInputError
from spotmorph.local import daemons
from spotmorph.local.layout import ClusterDir, ControllerFiles
from spotmorph.local.processes import alive, read_pid, wait_for

MAX_CONTROLLERS = 5


def check_controllers(count: int, database: str | None) -> None:
    """``--controllers`` and ``--database`` together make sense (several need a database they share)."""
    if not 1 <= count <= MAX_CONTROLLERS:
        raise UserInputError(f"--controllers {count}: give 1 to {MAX_CONTROLLERS}")
    if count > 1 and not database:
        raise UserInputError(
            f"--controllers {count}: several controllers share one PostgreSQL database; give --database "
            "postgresql://USER@HOST:PORT/DB"
        )
    if database:
        try:
            database_url(database)
        except StoreError as exc:
            raise UserInputError(str(exc)) from None


def command(files: ControllerFiles, address: str, settings: str, plaintext: bool) -> list[str]:
    """Controller ``files``'s command line, recorded so that it can be started again the same way."""
    line = [sys.executable, "-m", "spotmorph.cli", "controller", "--state-dir", str(files.state)]
    line += ["--listen", address, "--config", settings]
    return [*line, "--allow-plaintext"] if plaintext else line


def start(files: ControllerFiles, env: Mapping[str, str] | None = None) -> int:
    """Start (or restart, after a crash) a controller with its recorded command line (forked where this process
    may fork: :mod:`spotmorph.local.daemons`)."""
    files.state.mkdir(parents=True, exist_ok=True)
    pid = daemons.start(json.loads(files.command.read_text()), files.log, env)
    files.pid_file.write_text(str(pid))
    return pid


def start_standbys(cluster: ClusterDir, count: int, env: Mapping[str, str] | None = None) -> list[str]:
    """Controllers 2..count (their commands recorded), started after the first leads; their addresses."""
    addresses = []
    for index in range(2, count + 1):
        files = cluster.controller_files(index)
        start(files, env)
        wait_for(files.address_file.exists, 60, f"controller {index} to serve", log=files.log)
        addresses.append(files.address_file.read_text().strip())
    return addresses


@dataclass(frozen=True)
class Leader:
    index: int
    files: ControllerFiles
    lease: Lease


def leader(cluster: ClusterDir) -> Leader | None:
    """The controller the lease names (None: no database, no lease, or one not of this cluster)."""
    if not cluster.database_url.exists():
        return None
    store = Store(cluster.database_url.read_text().strip())
    try:
        lease = leases.current(store.engine)
    finally:
        store.close()
    if lease is None:
        return None
    for index, files in enumerate(cluster.controllers(), 1):
        if files.address_file.exists() and files.address_file.read_text().strip() == lease.address:
            return Leader(index, files, lease)
    return None


def kill_leader(cluster: ClusterDir) -> Leader:
    """SIGKILL the leading controller (its process group: a head node dying); the standbys take over."""
    if not cluster.database_url.exists():
        raise UserInputError(
            "this local cluster has one controller on SQLite; `local up --controllers 2 --database URL`"
        )
    found = leader(cluster)
    pid = read_pid(found.files.pid_file) if found else None
    if found is None or pid is None or not alive(pid):
        raise UserInputError("no controller of this cluster leads now (the lease is being taken over); try again")
    os.killpg(pid, signal.SIGKILL)
    return found
