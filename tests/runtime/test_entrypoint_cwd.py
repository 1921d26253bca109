"""A module entrypoint imports from the directory the user runs ``spotmorph`` in, as ``python -m`` would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.helpers import REPO

SCRIPT = Path(sys.executable).parent / "spotmorph"  # the console script `pip install` made


@pytest.mark.slow
def test_the_console_script_trains_a_module_entrypoint_from_the_current_directory(tmp_path: Path) -> None:
    shutil.copy(REPO / "examples" / "tiny_gpt.py", tmp_path / "cwd_model_for_test.py")
    train = ["train", "cwd_model_for_test:build_tiny", "--steps=1", "--global-batch=4"]
    done = subprocess.run(
        [str(SCRIPT), *train, f"--checkpoint-dir={tmp_path / 'ckpt'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (manifest,) = (tmp_path / "ckpt").glob("step-*/manifest.json")
    assert json.loads(manifest.read_text())["step"] == 1
