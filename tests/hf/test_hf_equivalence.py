"""Hugging Face models through the adapter, dropout on, float64: a chain of layouts (D = 4 does not divide
B = 6, so micro-batches are padded) ends where a 1x1 run ends, in both loss modes, and a run stopped and
resumed in the same layout ends where an uninterrupted one does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.runtime.helpers import REPO, Result, run
from worker_agent.contract import StepCompleted, events_of, read_progress
from worker_agent.runtime.storage import checkpoint as ck

pytestmark = pytest.mark.slow
MODELS = f"{REPO}/tests/hf/hf_models.py"
B = 6


def hf_train(ckpt: Path, entry: str, stages: int, replicas: int, steps: int, run_dir: Path) -> Result:
    cmd = [sys.executable, "-m", "spotmorph.cli", "train", f"{MODELS}:{entry}", f"--stages={stages}"]
    cmd += [f"--replicas={replicas}", f"--steps={steps}", f"--checkpoint-dir={ckpt}", f"--global-batch={B}"]
    cmd += ["--micro-batch-size=2", "--dtype=float64", "--log-every=1", f"--run-dir={run_dir}"]
    result = run(cmd, timeout=300)
    assert result.returncode == 0, result.explain()
    return result


def step_losses(*run_dirs: Path) -> dict[int, float]:
    return {
        e.step: e.loss for d in run_dirs for e in events_of(read_progress(d / "progress-rank-0.jsonl"), StepCompleted)
    }


def expected_first_loss(entry: str) -> float:
    """Step 0's global-batch loss computed here, in one process: what every layout must report."""
    from worker_agent.runtime.model.entrypoint import build_spec
    from worker_agent.runtime.model.model_api import sample_context
    from worker_agent.runtime.numerics.batch import (
        count_target_tokens,
        run_layers,
        signature,
        stack_samples,
        weighted_loss,
    )
    from worker_agent.runtime.numerics.job import step_indices

    spec = build_spec(f"{MODELS}:{entry}", 0)
    modules = [m for _, m in spec.layers]
    torch.nn.ModuleList(modules).to(torch.float64).train()
    indices = step_indices(0, B, len(spec.dataset), 0)
    items = [spec.dataset[i] for i in indices]
    inputs, targets = stack_samples(items, signature(items[0]))
    with torch.no_grad(), sample_context(0, 0, torch.tensor(indices)):
        per_item = spec.loss(run_layers(modules, inputs), targets)
    denominator = count_target_tokens(spec.dataset, indices) if spec.loss_normalization == "token" else B
    return float(
        weighted_loss(per_item, targets, torch.ones(B, dtype=torch.float64), spec.loss_normalization, denominator)
    )


# GPT-2 token-level in `make test` (Llama runs there in test_hf_exact's chain, per-sample losses in the
# demo model's chains); the other three pairs in `make soak` (each chain is over a minute on two cores).
@pytest.mark.parametrize(
    "entry",
    [
        "gpt2_token",
        pytest.param("gpt2_sample", marks=pytest.mark.soak),
        pytest.param("llama_token", marks=pytest.mark.soak),
        pytest.param("llama_sample", marks=pytest.mark.soak),
    ],
)
def test_chain_of_layouts_matches_a_single_process(tmp_path: Path, entry: str) -> None:
    reference, morphed = tmp_path / "reference", tmp_path / "morphed"
    hf_train(reference, entry, 1, 1, 3, tmp_path / "run-ref")
    chain = [(2, 2, 1), (3, 1, 2), (1, 4, 3)]
    for p, d, until in chain:
        hf_train(morphed, entry, p, d, until, tmp_path / f"run-{p}x{d}")
    result = ck.diff(ck.resolve(reference), ck.resolve(morphed))
    assert result["step_a"] == result["step_b"] == 3
    assert result["missing"] == [] and result["tensors_compared"] > 30
    assert result["max_rel"] <= 1e-9, result
    ref_losses = step_losses(tmp_path / "run-ref")
    chain_losses = step_losses(*(tmp_path / f"run-{p}x{d}" for p, d, _ in chain))
    assert sorted(ref_losses) == sorted(chain_losses) == [1, 2, 3]
    for step, loss in ref_losses.items():
        assert chain_losses[step] == pytest.approx(loss, rel=1e-12)
    assert ref_losses[1] == pytest.approx(expected_first_loss(entry), rel=1e-12)


# In make soak: make test's chains above and in test_hf_exact resume in other layouts and, exact, bit for bit.
@pytest.mark.parametrize(
    "entry", [pytest.param("gpt2_token", marks=pytest.mark.soak), pytest.param("llama_sample", marks=pytest.mark.soak)]
)
def test_stop_and_resume_in_the_same_layout_equals_an_uninterrupted_run(tmp_path: Path, entry: str) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    hf_train(straight, entry, 2, 1, 2, tmp_path / "run-straight")
    hf_train(resumed, entry, 2, 1, 1, tmp_path / "run-a")
    hf_train(resumed, entry, 2, 1, 2, tmp_path / "run-b")
    result = ck.diff(ck.resolve(straight), ck.resolve(resumed))
    assert result["step_a"] == result["step_b"] == 2 and result["missing"] == []
    assert result["max_abs"] == 0.0, result
