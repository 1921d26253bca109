"""Issue 23: ``spotmorph checkpoint diff`` gives a verdict: exit 1 when a bound is broken (naming the worst
tensor) or the checkpoints are of different models or steps, 2 on bad input, 0 when they agree as asked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.runtime.helpers import REPO, TINY, Result, run, train_cmd

# One worker runs the module and its training fixture is session-scoped: it runs once, not once per xdist
# worker, nor again after the worker ran another module's tests in between (a module scope would tear it down).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("checkpoint-diff-runs")]
DEMO = f"{REPO}/examples/tiny_gpt.py:build"


def diff(*args: str | Path) -> Result:
    return run([sys.executable, "-m", "spotmorph.cli", "checkpoint", "diff", *map(str, args)])


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diff")
    for name, stages, steps, entry in (("a", 1, 3, TINY), ("b", 2, 3, TINY), ("c", 1, 2, TINY), ("d", 1, 3, DEMO)):
        result = run(train_cmd(root / name, stages, 1, steps, "--dtype=float32", entrypoint=entry), timeout=300)
        assert result.returncode == 0, result.explain()
    return root


def test_a_bound_met_is_exit_0_and_a_bound_broken_is_exit_1_naming_the_worst_tensor(runs: Path) -> None:
    loose = diff(runs / "a", runs / "b", "--max-rel", "1e-2")
    assert loose.returncode == 0 and "DIFFER" not in loose.stderr, loose.stdout + loose.stderr
    tight = diff(runs / "a", runs / "b", "--max-rel", "0")
    assert tight.returncode == 1 and "DIFFER: max_rel" in tight.stderr and ", worst " in tight.stderr
    assert diff(runs / "a", runs / "b", "--bitwise").returncode == 1  # float32 in another layout: not bitwise
    same = diff(runs / "a", runs / "a", "--bitwise", "--max-rel", "0")
    assert same.returncode == 0 and "bitwise equal" in same.stdout


def test_other_steps_or_another_model_are_a_failure_not_a_number(runs: Path) -> None:
    steps = diff(runs / "a", runs / "c")
    assert steps.returncode == 1 and "different steps (3 vs 2)" in steps.stderr
    model = diff(runs / "a", runs / "d", "--json")
    assert model.returncode == 1 and '"verdict": "differ"' in model.stdout and "different models" in model.stdout


@pytest.mark.parametrize("bound", ["nan", "-1", "inf", "tiny"])
def test_a_bound_that_is_no_number_is_exit_2(runs: Path, bound: str) -> None:
    bad = diff(runs / "a", runs / "b", "--max-rel", bound)
    assert bad.returncode == 2 and f"--max-rel {bound!r}" in bad.stderr and "Traceback" not in bad.stderr
