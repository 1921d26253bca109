"""Warm trainers are on by default (one per slot) and can be turned off; bad values exit 2 with the fix."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from morphing.errors import UserInputError
from worker_agent.commands.agent import add_arguments, warm_count


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_default_keeps_one_warm_trainer_per_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOTMORPH_WARM_TRAINERS", raising=False)
    assert warm_count(parsed().warm_trainers, 4) == 4


@pytest.mark.parametrize(("value", "slots", "expected"), [("0", 3, 0), ("off", 3, 0), ("2", 3, 2), ("slots", 2, 2)])
def test_warm_trainers_can_be_set_or_turned_off(value: str, slots: int, expected: int) -> None:
    assert warm_count(value, slots) == expected


def test_the_environment_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTMORPH_WARM_TRAINERS", "0")
    assert warm_count(parsed().warm_trainers, 4) == 0


@pytest.mark.parametrize("value", ["-1", "many", ""])
def test_a_bad_value_names_the_choices(value: str) -> None:
    with pytest.raises(UserInputError, match="'slots', a number >= 0 or 'off'"):
        warm_count(value, 1)


def test_the_agent_command_exits_2_on_a_bad_value(tmp_path: object) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "spotmorph.cli", "agent", "--controller", "127.0.0.1:1", "--warm-trainers", "x"],
        capture_output=True,
        text=True,
        env={"SPOTMORPH_AGENT_TOKEN": "t", "PATH": "/usr/bin:/bin", **_pythonpath()},
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "--warm-trainers 'x'" in out.stderr


def _pythonpath() -> dict[str, str]:
    import os

    return {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
