"""Ending a trainer that holds a step of the job its node goes on with: asked to give up its generation first, killed
only after RELEASE_SECONDS (the pure rule); and how a holder says its generation ended (held.json's code, hostile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker_agent.agent.holders import RELEASE_SECONDS, Ending, ending
from worker_agent.contract import ExitCode, WarmSpool

TIMES = st.floats(0, 1e9, allow_nan=False)


def test_a_trainer_holding_nothing_of_the_job_is_killed_at_once() -> None:
    assert ending(False, None, 10.0) is Ending.KILL
    assert ending(False, 9.0, 10.0) is Ending.KILL


def test_a_holder_is_asked_once_then_given_release_seconds_then_killed() -> None:
    assert ending(True, None, 10.0) is Ending.ASK
    assert ending(True, 10.0, 10.0 + RELEASE_SECONDS - 0.01) is Ending.WAIT
    assert ending(True, 10.0, 10.0 + RELEASE_SECONDS) is Ending.KILL


@given(TIMES, st.floats(0, 60, allow_nan=False))
def test_a_holder_is_never_killed_before_its_release_time_nor_waited_for_after_it(asked: float, later: float) -> None:
    verdict = ending(True, asked, asked + later)
    assert verdict is (Ending.WAIT if later < RELEASE_SECONDS else Ending.KILL)


@pytest.mark.parametrize(
    ("written", "code"),
    [
        ({"step": 5}, ExitCode.SUCCEEDED),  # an older trainer's file: a stop that kept its step
        ({"step": 5, "code": 0}, ExitCode.SUCCEEDED),
        ({"step": 5, "code": 2}, ExitCode.USER_ERROR),  # its rank 0's port was taken
        ({"step": 5, "code": True}, ExitCode.ABORTED),  # hostile from here on: never read as success
        ({"step": 5, "code": -9}, ExitCode.ABORTED),
        ({"step": 5, "code": 256}, ExitCode.ABORTED),
        ({"step": 5, "code": "0"}, ExitCode.ABORTED),
        ([1, 2], ExitCode.ABORTED),
    ],
)
def test_a_holder_says_how_its_generation_ended(tmp_path: Path, written: object, code: int) -> None:
    spool = WarmSpool(tmp_path)
    spool.held_file.write_text(json.dumps(written))
    assert spool.held_exit_code() == code


def test_a_held_file_that_cannot_be_read_says_aborted(tmp_path: Path) -> None:
    spool = WarmSpool(tmp_path)
    spool.held_file.write_text("{" * 10)
    assert spool.held_exit_code() == ExitCode.ABORTED
    spool.held_file.write_text(json.dumps({"code": 0, "pad": "x" * 5000}))  # past the 4 KiB a held file may be
    assert spool.held_exit_code() == ExitCode.ABORTED
    spool.held_file.unlink()
    assert spool.held_exit_code() == ExitCode.ABORTED
