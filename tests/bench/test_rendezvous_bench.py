"""bench/rendezvous_bench.py runs both ways against a real store started late, and prints a row per delay
without touching the docs when told not to."""

from __future__ import annotations

import pytest

from bench.rendezvous_bench import MODES, main
from tests.runtime.helpers import REPO


def test_both_ways_connect_to_a_store_started_late_and_each_delay_gets_a_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    assert main(["--delays", "0,0.05", "--repeat", "1", "--no-docs"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| host late by s |"))
    assert [c.strip() for c in header.split("|")[2:-1]] == list(MODES)
    rows = [line for line in out.splitlines() if line.startswith(("| 0.00 |", "| 0.05 |"))]
    assert len(rows) == 2
    for row in rows:
        seconds = [float(cell.split()[0]) for cell in row.split("|")[2:-1]]
        assert len(seconds) == 2 and all(s >= 0 for s in seconds), row
    assert (REPO / "docs" / "benchmarks.md").read_text() == docs


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--repeat", "0"])
    assert exited.value.code == 2 and "--repeat 1 or more" in capsys.readouterr().err
