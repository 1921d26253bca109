"""`spotmorph train` prints every N steps the loss, the rate and the time left at this run's pace."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from worker_agent.contract.events import ProgressRecord, StepCompleted
from worker_agent.runtime.launcher import _Relay


class Lines:
    def __init__(self, records: Iterable[ProgressRecord]) -> None:
        self.records = list(records)

    def poll(self) -> list[ProgressRecord]:
        out, self.records = self.records, []
        return out


def step(n: int, at: float) -> ProgressRecord:
    return ProgressRecord(StepCompleted(n, 2.0 / n, 0.5, 32.0, None), 0, 0, 1, at)


def test_each_line_says_the_time_left_at_the_pace_so_far(capsys: pytest.CaptureFixture[str]) -> None:
    # resumed at step 100 (its first step this run at t=0), then 2 s a step, of 1,000 steps
    relay = _Relay(Lines([step(101, 0.0), step(110, 18.0), step(120, 38.0), step(1000, 1798.0)]), 10, 1000)  # type: ignore[arg-type]
    relay.poll()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step    110  loss 0.0182") and lines[0].endswith("  29m40s left")
    assert lines[1].endswith("  29m20s left")
    assert lines[2].endswith("samples/s")  # the last step: nothing left


def test_hours_are_said_in_hours(capsys: pytest.CaptureFixture[str]) -> None:
    _Relay(Lines([step(1, 0.0), step(10, 90.0)]), 10, 10_000).poll()  # type: ignore[arg-type]
    assert capsys.readouterr().out.strip().endswith("  27h45m left")
