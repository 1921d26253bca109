"""A real local cluster per test (spotmorph.local.harness): controller, IMDS platform and agent processes.

When a test fails, the controller's event log, the jobs the test submitted with their seeds and the
tail of every log are printed, so a red run says why and how to run it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spotmorph.local.harness import LocalCluster

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
    """Where the uninterrupted single-process runs are kept, each trained once per session."""
    return tmp_path_factory.mktemp("references")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path / "home")
    try:
        yield local
    finally:
        local.down()
        assert_nothing_left(local.files.root)  # a --netns cluster leaves no namespace or link behind
