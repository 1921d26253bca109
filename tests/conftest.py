"""Test-suite wide: tests marked ``soak`` (long variants) run only when ``-m`` selects them (``make soak``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "soak" in str(config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="a soak test (minutes): run with `make soak` or `pytest -m soak`")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
