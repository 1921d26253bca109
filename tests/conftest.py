"""Test-suite wide: tests marked ``soak`` (long variants) run only when ``-m`` selects them (``make soak``).

``make test`` runs on two pytest-xdist workers (``--dist loadgroup``): the tests that start local clusters
(``tests/e2e``, ``tests/local``) form one group, run one after another on one worker, so at most one cluster
loads the machine at a time, while the other worker takes the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CLUSTER_DIRS = ("e2e", "local")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
        if parts and parts[0] in CLUSTER_DIRS:
            item.add_marker(pytest.mark.xdist_group("clusters"))
    if "soak" in str(config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="a soak test (minutes): run with `make soak` or `pytest -m soak`")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` on a pytest with which pytest-xdist no longer groups (from 9.2, whose node ids
    xdist can no longer tag with the group: pytest-dev/pytest-xdist#1386): the clusters' tests would silently
    run two at a time."""
    broken = tuple(int(part) for part in pytest.version_tuple[:2] if isinstance(part, int)) >= (9, 2)
    if broken and config.getoption("dist", "no") == "loadgroup":
        raise pytest.UsageError(
            f"pytest {pytest.__version__} breaks --dist loadgroup (pytest-dev/pytest-xdist#1386): install the "
            "pytest pyproject.toml allows (pip install -e '.[dev]'), or run without -n"
        )
