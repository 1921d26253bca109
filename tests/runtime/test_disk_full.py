"""A full checkpoint disk: the write fails loudly, its partial files go, the previous checkpoint stays."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime.helpers import run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1.2 MB filesystem: room for one checkpoint of the demo model, not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_full_disk_fails_the_checkpoint_loudly_and_keeps_the_previous_one(small_disk: Path, tmp_path: Path) -> None:
    checkpoints = small_disk / "ckpt"
    cmd = [
        sys.executable,
        "-m",
        "spotmorph.cli",
        "train",
        f"{REPO}/examples/tiny_gpt.py:build",
        "--global-batch=8",
        "--steps=30",
        "--checkpoint-interval=10",
        f"--checkpoint-dir={checkpoints}",
        f"--run-dir={tmp_path / 'run'}",
    ]
    result = run(cmd)
    assert result.returncode != 0, result.explain()
    assert "No space left on device" in result.stderr
    assert "previous checkpoint (step 10) is kept" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000010"]
    verify = run([cmd[0], "-m", "spotmorph.cli", "checkpoint", "verify", str(checkpoints)])
    assert verify.returncode == 0, verify.explain()
    assert "valid, step 10" in verify.stdout
