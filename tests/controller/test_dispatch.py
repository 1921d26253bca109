"""A command type that the world's apply, the store, the runner's side effects or the agent does not name is an
error, never silently dropped (mypy checks the chains are exhaustive through ``assert_never``; this is the
runtime half)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.core.model import SetNodeSeq, World, apply
from controller.core.reconcile import Config
from controller.persistence.store import Store
from controller.providers.base import StaticProvider
from controller.shell.runner import Runner
from tests.controller.helpers import FakeClock
from worker_agent.agent.perform import perform
from worker_agent.agent.supervisor import Supervisor


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


def test_the_runner_refuses_to_act_on_a_command_it_does_not_know(tmp_path: Path) -> None:
    runner = Runner(Store(tmp_path / "state.db"), FakeClock(), Config(), StaticProvider())
    unknown: Any = Unknown()
    with pytest.raises(AssertionError):
        runner._act(unknown)
    runner.store.close()


def test_the_agent_refuses_to_perform_a_command_it_does_not_know(tmp_path: Path) -> None:
    unknown: Any = Unknown()
    with pytest.raises(AssertionError):
        perform(unknown, Supervisor(tmp_path / "work"), (), 1, {}, leaving=False)
