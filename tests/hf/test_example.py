"""``examples/hf_gpt2.py``: its shipped token files are what ``data prepare`` makes of the shipped text, its
job file is a valid spec, and ``spotmorph train`` runs it (with evaluation) for a few steps."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from controller.spec import entrypoint_problem, load_spec_file, profile_problem
from spotmorph.cli import main
from tests.runtime.helpers import REPO, run

DATA = REPO / "examples" / "data"


@pytest.mark.parametrize("name", ["lighthouse", "lighthouse_eval"])
def test_the_shipped_token_files_are_the_prepared_text(tmp_path: Path, name: str) -> None:
    out = tmp_path / f"{name}.bin"
    assert main(["data", "prepare", str(DATA / f"{name}.txt"), f"--out={out}"]) == 0
    assert out.read_bytes() == (DATA / f"{name}.bin").read_bytes()
    fresh, shipped = json.loads(Path(f"{out}.json").read_text()), json.loads((DATA / f"{name}.bin.json").read_text())
    assert {k: v for k, v in fresh.items() if k != "sources"} == {k: v for k, v in shipped.items() if k != "sources"}


def test_the_job_file_is_a_valid_spec() -> None:
    spec = load_spec_file(str(REPO / "examples" / "hf_gpt2.yaml"))
    assert spec.eval_interval == 20
    assert entrypoint_problem(spec) is None
    assert profile_problem(spec) is None


@pytest.mark.slow
def test_spotmorph_train_runs_the_example(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "spotmorph.cli", "train", f"{REPO}/examples/hf_gpt2.py:build"]
    cmd += ["--stages=1", "--replicas=1", "--global-batch=4", "--steps=3", "--eval-interval=3", "--log-every=1"]
    result = run([*cmd, f"--checkpoint-dir={tmp_path / 'ckpt'}", "--device=cpu"], timeout=300)
    assert result.returncode == 0, result.explain()
    first = float(re.findall(r"step +1  loss ([0-9.]+)", result.stdout)[0])
    assert abs(first - math.log(257)) < 0.5, result.stdout  # an untrained model: about ln(vocabulary)
    evaluated = float(re.findall(r"eval at step 3  loss ([0-9.]+)", result.stdout)[0])
    assert 0 < evaluated < first + 0.5, result.stdout
    assert (tmp_path / "ckpt" / "hf_config.json").is_file()
