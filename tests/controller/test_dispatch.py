"""A command type that the world's apply or the store does not name is an error, never silently dropped
(mypy checks the chains are exhaustive through ``assert_never``; this is the runtime half)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.core.model import SetNodeSeq, World, apply
from controller.persistence.store import Store


class Unknown:
    """A command some later change might add without teaching apply or the store about it."""


def test_apply_refuses_a_command_it_does_not_know() -> None:
    unknown: Any = Unknown()
    with pytest.raises(AssertionError):
        apply(World({}, {}), [unknown])


def test_the_store_refuses_a_command_it_does_not_know_and_keeps_nothing_of_the_batch(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    unknown: Any = Unknown()
    with pytest.raises(AssertionError):
        store.persist([SetNodeSeq(7), unknown])  # one transaction: the counter is not moved either
    assert store.load() == ({}, {}) and store.counters()[1] == 0
    store.close()
