"""bench/memory_morph_bench.py --quick: the 4M GPT-2's growth, once through memory and once through the disk,
on real local clusters. A soak test: the profile and two clusters take over a minute on a 2-core machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.soak
REPO = Path(__file__).resolve().parents[2]


def test_the_quick_memory_morph_bench_grows_through_memory_and_through_the_disk() -> None:
    pytest.importorskip("transformers")
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    result = subprocess.run(
        [sys.executable, "bench/memory_morph_bench.py", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Toy run (`--quick`), not a measurement." in out, out
    rows = {line.split("|")[5].strip(): line for line in out.splitlines() if line.startswith("| 4M | 4.1M |")}
    assert set(rows) == {"memory", "disk"}, out
    for path, line in rows.items():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[3].startswith("growth") and cells[8] == path, line  # g+1 resumed from where it was told to
        assert float(cells[6]) > 0 and cells[9] == "0", line  # a pause, no step lost
    assert not [line for line in out.splitlines() if line.startswith("- 4m growth memory:")], out  # nothing odd
    assert (REPO / "docs" / "benchmarks.md").read_text() == docs
