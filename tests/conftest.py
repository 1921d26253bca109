"""Test-suite wide: tests marked ``soak`` (long variants) run only when ``-m`` selects them (``make soak``).

``make test`` runs on two pytest-xdist workers (``--dist loadgroup``): tests that share an expensive session
fixture name an ``xdist_group`` so they run on one worker. The tests that start local clusters run on both
workers, two clusters at a time at most: the suite is bound by the CPU, and two at a time overlap the waits
each has (a notice, a heartbeat's expiry) with the other's work. The harness's ``spotmorph`` commands are forked
from the worker's fork server (tests/forkserver.py) rather than started as new interpreters. The PostgreSQL
server (``postgres_server``, a second to start) is one per worker, not a group's: the store's tests then run
on both workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from spotmorph.local import cli_calls
from tests import forkserver_client
from tests.postgres import MISSING, PostgresServer, find_binaries
from tests.zygotes import zygotes
from worker_agent.agent.zygote import InheritedProcess
from worker_agent.runtime.process.warm import IMPORTS_ENV

SLOW_SECONDS = 3.0  # a test this long (its three phases) without the `slow` marker is named at the end of a run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with slow tests first (a stable sort of whole files: each keeps its order and its module fixtures), so
    the two workers end on short tests instead of one waiting out the other's last local cluster; soak tests
    skipped unless ``-m`` selects them."""
    slow_files = {item.path for item in items if "slow" in item.keywords and "soak" not in item.keywords}
    items.sort(key=lambda item: item.path not in slow_files)
    if "soak" in str(config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="a soak test (minutes): run with `make soak` or `pytest -m soak`")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    """Warm trainers import nothing ahead unless a test says so. Refuse ``--dist loadgroup`` on a pytest with
    which pytest-xdist no longer groups (from 9.2, whose node ids xdist can no longer tag with the group:
    pytest-dev/pytest-xdist#1386): the tests of one group would silently run on both workers, each building
    their session fixture."""
    # Warm trainers and zygotes import no model library ahead (2 s of CPU each, ~100 of them in a run): the
    # clusters here train the tiny models; tests/runtime/test_warm_preload.py runs the default.
    os.environ.setdefault(IMPORTS_ENV, "")
    broken = tuple(int(part) for part in pytest.version_tuple[:2] if isinstance(part, int)) >= (9, 2)
    if broken and config.getoption("dist", "no") == "loadgroup":
        raise pytest.UsageError(
            f"pytest {pytest.__version__} breaks --dist loadgroup (pytest-dev/pytest-xdist#1386): install the "
            "pytest pyproject.toml allows (pip install -e '.[dev]'), or run without -n"
        )
    if not hasattr(config, "workerinput"):  # the controlling process sees every worker's reports
        config.pluginmanager.register(_Unmarked(), "spotmorph-unmarked-slow")


@pytest.fixture(autouse=True, scope="session")
def _harness_commands_forked() -> Iterator[None]:
    """The harness's ``spotmorph`` commands (``local up``, ``checkpoint diff``, a reference ``train``) forked from
    this worker's fork server, as the runtime tests' are; ``SPOTMORPH_TEST_FORKSERVER=0`` starts each anew."""
    if not forkserver_client.enabled():
        yield
        return

    def forked(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
        return forkserver_client.run(argv, cli_calls.ROOT, timeout, env)

    cli_calls.use_runner(forked)
    yield
    cli_calls.use_runner(None)


@pytest.fixture
def node_zygote(tmp_path: Path) -> Iterator[Callable[[], InheritedProcess | None]]:
    """Zygotes, forked from this worker's fork server, for the supervisors a test drives (``Supervisor(...,
    warm=1, zygote=True, inherited=node_zygote())``): their trainers are forks, not new interpreters; this
    worker is a child subreaper until the test ends (tests/zygotes.py)."""
    with zygotes(tmp_path / "zygotes") as one:
        yield one


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """This worker's PostgreSQL server, started the first time a test asks; skipped without PostgreSQL."""
    binaries = find_binaries()
    if binaries is None:
        pytest.skip(MISSING)
    with PostgresServer.start(binaries) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database's SQLAlchemy URL, dropped after the test (its connections ended first)."""
    name = postgres_server.unique_name("test")
    yield postgres_server.create_database(name)
    postgres_server.drop_database(name)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """What ``Store`` opens, once for each store: a SQLite file, then a fresh PostgreSQL database's URL (the
    server started only for this one, so the SQLite case runs on a machine without PostgreSQL)."""
    if request.param == "sqlite":
        return tmp_path / "state.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


class _Unmarked:
    """The tests that took ``SLOW_SECONDS`` or more without the ``slow`` marker, so ``pytest -m "not slow"`` (the
    quick loop) stays quick: named at the end of the run, never failed (tests assert no wall-clock times)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" not in report.keywords and "soak" not in report.keywords:
            self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        found = sorted(((s, n) for n, s in self.seconds.items() if s >= SLOW_SECONDS), reverse=True)
        if found:
            terminalreporter.section(f"tests of {SLOW_SECONDS:g} s or more without the slow marker")
            for seconds, nodeid in found:
                terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
