"""``spotmorph train`` without ``--micro-batch-size``: one stage runs each replica's share as one micro-batch,
and the result is the same as with any other micro-batch size (the batch invariant)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.runtime.helpers import TINY, run
from worker_agent.runtime.storage import checkpoint as ck

pytestmark = pytest.mark.slow


def train(directory: Path, replicas: int, *extra: str) -> str:
    cmd = [sys.executable, "-m", "spotmorph.cli", "train", TINY, "--stages=1", f"--replicas={replicas}"]
    cmd += ["--global-batch=12", "--steps=3", "--dtype=float64", "--device=cpu", f"--checkpoint-dir={directory}"]
    result = run([*cmd, *extra])
    assert result.returncode == 0, result.explain()
    return result.stderr


def test_one_stage_runs_the_whole_share_as_one_micro_batch_with_the_same_result(tmp_path: Path) -> None:
    assert "layout 1x1 (P x D), m=12," in train(tmp_path / "default", 1)
    assert "layout 1x2 (P x D), m=6," in train(tmp_path / "two", 2)
    train(tmp_path / "split", 1, "--micro-batch-size=5")  # three uneven micro-batches, the last padded
    default = ck.resolve(tmp_path / "default")
    for other in ("two", "split"):
        diff = ck.diff(default, ck.resolve(tmp_path / other))
        assert diff["missing"] == [] and diff["max_rel"] <= 1e-9, (other, diff)
