"""A real local cluster per test (spotmorph.local.harness): controller, IMDS platform and agent processes.

When a test fails, the controller's event log, the jobs the test submitted with their seeds and the
tail of every log are printed, so a red run says why and how to run it again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.persistence.store import Store
from spotmorph.local.harness import LocalCluster
from spotmorph.local.layout import ClusterDir

from .netns_helpers import assert_nothing_left


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report gets the cluster's failure report (printed with the failure)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    local = getattr(item, "funcargs", {}).get("cluster")
    if report.when == "call" and report.failed and isinstance(local, LocalCluster):
        report.sections.append(("local cluster: event log, jobs and their seeds, logs", local.failure_report()))


@pytest.fixture(scope="session")
def references(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the uninterrupted single-process runs are kept, each trained once per test run: one folder for
    both xdist workers (the run's temporary root; a worker's own is below it), so the first worker to need a
    reference trains it and the other waits on its lock (``train_reference``)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return shared / "references"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "home")
    violated: list[str] = []
    try:
        yield local
    finally:
        violated = invariant_violations(local.files)
        if violated:
            local.notes.append("the controller refused decisions that broke invariants (a bug):")
            print(local.failure_report())
        local.down()
        assert_nothing_left(local.files.root)  # a --netns cluster leaves no namespace or link behind
    assert not violated, "the controller's decisions broke invariants (InvariantViolated):\n" + "\n".join(violated)


def invariant_violations(files: ClusterDir) -> list[str]:
    """What the controller's ``InvariantViolated`` events say: every local cluster validates each decision
    (``validate_invariants``), so any is a bug, whatever the test saw. Read from the state database (SQLite, or
    the PostgreSQL the controllers share), which outlives a controller the test killed."""
    if files.database_url.exists():
        store = Store(files.database_url.read_text().strip())
        try:
            rows = [(e.at, e.data) for e in store.recent_events(None, ["InvariantViolated"], 1000)]
        finally:
            store.close()
        return [f"at {at:.3f}: {data}" for at, data in rows]
    database = files.state / "state.db"
    if not database.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT at, data FROM events WHERE kind = 'InvariantViolated' ORDER BY seq").fetchall()
    return [f"at {at:.3f}: {data}" for at, data in rows]
