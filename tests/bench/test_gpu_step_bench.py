"""bench/gpu_step_bench.py at toy sizes on whatever device there is, with a baseline tree beside it: every
row and the profile are there, so its first run on a GPU does not stop at a wrong call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.helpers import REPO


@pytest.mark.soak  # four `spotmorph train` runs; bench/gpu_check.sh runs the real one on a GPU
def test_the_step_bench_smoke_run_has_every_row_and_the_profile(tmp_path: Path) -> None:
    tree = tmp_path / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    cmd = [
        sys.executable,
        "bench/gpu_step_bench.py",
        "--smoke",
        "--baseline",
        str(tree),
        "--profile-dir",
        str(tmp_path),
    ]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    for row in ("| spotmorph train 1x1, before (baseline) |", "| spotmorph train 1x1 |", "| plain PyTorch loop |"):
        assert row in result.stdout, (row, result.stdout)
    assert "host waits a step" in result.stdout and (tmp_path / "profile-rank0.json").is_file()
    assert (REPO / "docs" / "benchmarks.md").read_text() == docs


def test_a_baseline_that_is_no_spotmorph_tree_is_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, "bench/gpu_step_bench.py", "--smoke", "--baseline", str(tmp_path)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "is not a spotmorph source tree" in result.stderr, result
