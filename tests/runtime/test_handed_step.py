"""A generation handed a step held in memory and aborted by its agent before it loaded it ends at once with
GenerationAbandoned (the process then holds the step again), whether it was blocked on a peer (the abort severs the
connection) or its last collective was already done. Each in a process of its own: the abort severs every TCP
connection of the process it runs in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("handed_probe.py")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["blocked", "after"])
def test_an_aborted_start_ends_at_once_and_keeps_the_step(tmp_path: Path, scenario: str) -> None:
    done = subprocess.run(
        [sys.executable, str(PROBE), str(tmp_path), scenario], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["raised"] == "GenerationAbandoned", said
    assert "before it took step 7 of generation 1, which this process holds again" in said["message"], said
    # no deadline in the probe: its peer never sends, so only the abort's cut ends the "blocked" one
