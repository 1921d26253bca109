"""``eval_interval``: the mean loss over the whole eval dataset, the same in every layout, equal to the loss
of the checkpoint's model in eval mode; a job that evaluates without an eval dataset exits 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.hf import eval_models
from tests.hf.test_hf_export import spotmorph_logits
from tests.runtime.helpers import REPO, run, train_cmd
from worker_agent.contract import EvaluationCompleted, events_of, read_progress
from worker_agent.runtime.model.hf_adapter import sample_losses, token_losses
from worker_agent.runtime.storage import checkpoint as ck

ENTRY = f"{REPO}/tests/hf/eval_models.py"


def evaluations(tmp_path: Path, name: str, stages: int, replicas: int, entry: str) -> list[EvaluationCompleted]:
    run_dir = tmp_path / f"run-{name}"
    cmd = train_cmd(tmp_path / name, stages, replicas, 4, "--dtype=float64", "--eval-interval=2", entrypoint=entry)
    result = run([*cmd, f"--run-dir={run_dir}"], timeout=300)
    assert result.returncode == 0, result.explain()
    assert "eval at step 4" in result.stdout, result.stdout
    return events_of(read_progress(next(run_dir.rglob("progress-rank-0.jsonl"))), EvaluationCompleted)


def reference(ckpt: ck.Checkpoint, mode: str) -> float:
    """The mean eval loss of the checkpoint's model, computed whole, in eval mode."""
    build = eval_models.gpt2_eval if mode == "token" else eval_models.gpt2_eval_sample
    data = build().eval_dataset
    assert data is not None
    items = [data[i] for i in range(len(data))]
    inputs = torch.stack([x for x, _ in items if isinstance(x, torch.Tensor)])
    targets = torch.stack([y for _, y in items])
    logits = spotmorph_logits(build, ckpt, inputs)
    if mode == "sample":
        return float(sample_losses(logits, targets).mean())
    return float(token_losses(logits, targets).sum() / (targets != -100).sum())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token", pytest.param("sample", marks=pytest.mark.soak)])  # per-sample: make soak
def test_eval_loss_is_layout_free_and_the_mean_over_the_eval_set(tmp_path: Path, mode: str) -> None:
    entry = f"{ENTRY}:gpt2_eval" if mode == "token" else f"{ENTRY}:gpt2_eval_sample"
    one = evaluations(tmp_path, "one", 1, 1, entry)
    four = evaluations(tmp_path, "four", 2, 2, entry)
    assert [e.step for e in one] == [2, 4] == [e.step for e in four]
    for a, b in zip(one, four, strict=True):
        assert abs(a.eval_loss - b.eval_loss) <= 1e-9 * abs(a.eval_loss), (a, b)
    assert one[0].eval_loss != one[1].eval_loss  # it follows training
    expected = reference(ck.resolve(tmp_path / "one"), mode)
    assert abs(one[1].eval_loss - expected) <= 1e-9 * expected, (one[1].eval_loss, expected)


@pytest.mark.slow
def test_evaluating_without_an_eval_dataset_exits_2(tmp_path: Path) -> None:
    cmd = train_cmd(tmp_path / "x", 1, 1, 2, "--eval-interval=1", entrypoint=f"{ENTRY}:gpt2_no_eval")
    result = run(cmd, timeout=300)
    assert result.returncode == 2, result.explain()
    assert "no eval_dataset" in result.stderr, result.explain()
