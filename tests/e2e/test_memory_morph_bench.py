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
    header = next(line for line in out.splitlines() if line.startswith("| model | params |"))
    names = [c.strip() for c in header.split("|")[1:-1]]
    lines = [line for line in out.splitlines() if line.startswith("| 4M | 4.1M |")]
    rows = [dict(zip(names, (c.strip() for c in line.split("|")[1:-1]), strict=True)) for line in lines]
    assert sorted(row["path"] for row in rows) == ["disk", "memory"], out
    for row in rows:
        assert row["morph"].startswith("growth") and row["resumed"] == row["path"], row  # as it was told to
        assert float(row["pause s"]) > 0 and row["lost"] == "0", row  # a pause, no step lost
        assert float(row["g+1 step s"]) > 0, row  # g+1 stepped after the morph's checkpoint was committed
        assert float(row["idle s"]) == pytest.approx(float(row["pause s"]) - float(row["g+1 step s"]), abs=0.011)
    assert not [line for line in out.splitlines() if line.startswith("- 4m growth memory:")], out  # nothing odd
    assert (REPO / "docs" / "benchmarks.md").read_text() == docs
