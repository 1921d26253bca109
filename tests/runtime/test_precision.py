"""bf16 and fp16 on the CPU (torch's CPU autocast), so CI covers mixed precision without a GPU.

What is true, and asserted: bf16 trains like fp32 (the loss curve within a tolerance); masters, optimizer
state and checkpoints stay float32; a checkpoint resumes in another precision; fp16's loss scale is the
same on every layout and survives a resume. What is not: a chain of layouts in bf16 is not equal to the
1x1 bf16 run to 1e-9 (float64 is the exactness mode); it agrees within a tolerance, as float32 does,
because summation order differs with the layout and bf16 rounds the weights' copies coarsely.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime.helpers import REPO, run, train_cmd
from worker_agent.contract import CheckpointWritten, GenerationDir, StepCompleted, events_of, read_progress
from worker_agent.runtime.storage import checkpoint as ck

pytestmark = pytest.mark.slow
LOUD = f"{REPO}/tests/runtime/precision_models.py:build_loud"


def _train(root: Path, stages: int, replicas: int, steps: int, *extra: str, entrypoint: str | None = None) -> None:
    kwargs = {"entrypoint": entrypoint} if entrypoint else {}
    result = run(train_cmd(root, stages, replicas, steps, *extra, **kwargs))
    assert result.returncode == 0, result.explain()


def _losses(run_dir: Path) -> list[float]:
    return [e.loss for e in events_of(read_progress(GenerationDir(run_dir).progress_file(0)), StepCompleted)]


def test_bf16_trains_like_fp32_with_float32_masters_in_the_checkpoint(tmp_path: Path) -> None:
    for precision in ("fp32", "bf16"):
        _train(tmp_path / precision, 1, 1, 30, f"--precision={precision}", f"--run-dir={tmp_path / f'run-{precision}'}")
    fp32, bf16 = _losses(tmp_path / "run-fp32"), _losses(tmp_path / "run-bf16")
    assert len(fp32) == len(bf16) == 30
    assert sum(bf16[-5:]) < 0.95 * sum(bf16[:5])  # it learns
    for a, b in zip(fp32, bf16, strict=True):
        assert abs(a - b) <= 0.02 * a, (fp32, bf16)
    assert fp32 != bf16  # and bf16 did compute in bfloat16 (the same losses would mean autocast was off)
    tensors = ck.read_all(ck.resolve(tmp_path / "bf16"))
    floats = {name: t.dtype for name, t in tensors.items() if t.is_floating_point()}
    assert floats and set(floats.values()) == {torch.float32}, floats
    assert any(name.endswith("/exp_avg") for name in floats)


@pytest.mark.soak  # make test: test_exact's bf16 chain is bitwise equal to 1x1
def test_a_bf16_layout_chain_agrees_with_1x1_bf16_within_the_float32_tolerance(tmp_path: Path) -> None:
    _train(tmp_path / "1x1", 1, 1, 10, "--precision=bf16")
    _train(tmp_path / "chain", 2, 2, 5, "--precision=bf16")
    _train(tmp_path / "chain", 3, 1, 10, "--precision=bf16")
    diff = ck.diff(ck.resolve(tmp_path / "1x1"), ck.resolve(tmp_path / "chain"))
    assert diff["missing"] == [] and diff["step_a"] == diff["step_b"] == 10
    assert diff["max_rel"] <= 1e-2, diff


def test_checkpoints_resume_in_another_precision(tmp_path: Path) -> None:
    """Checkpoints hold the float32 masters and optimizer state, so bf16 -> fp32 -> fp16 -> bf16 just works,
    in any layout; the job hash does not name the precision."""
    root = tmp_path / "ckpt"
    _train(root, 1, 1, 2, "--precision=bf16")
    _train(root, 2, 1, 4, "--precision=fp32")
    _train(root, 1, 2, 6, "--precision=fp16")
    _train(root, 2, 2, 8, "--precision=bf16")
    manifest = ck.resolve(root).manifest
    assert manifest.step == 8 and manifest.loss_scale is None  # only fp16 writes its scale
    reference = tmp_path / "fp32"
    _train(reference, 1, 1, 8, "--precision=fp32")
    assert ck.diff(ck.resolve(reference), ck.resolve(root))["max_rel"] <= 5e-2


def test_fp16_loss_scale_is_layout_free_and_survives_a_resume(tmp_path: Path) -> None:
    """At scale 2^16 the loud model's fp16 gradients overflow: every rank skips the step and halves the
    scale, the same way in every layout, and a resumed run continues from the saved scale."""
    _train(tmp_path / "three", 1, 1, 3, "--precision=fp16", entrypoint=LOUD)
    skipped = ck.resolve(tmp_path / "three")
    assert skipped.manifest.loss_scale is not None
    assert skipped.manifest.loss_scale.model_dump() == {"scale": 2.0**13, "good_steps": 0}
    assert all(not state for name, state in _optimizer_states(skipped).items()), "a skipped step updated"

    _train(tmp_path / "1x1", 1, 1, 12, "--precision=fp16", entrypoint=LOUD)
    _train(tmp_path / "chain", 2, 2, 6, "--precision=fp16", entrypoint=LOUD)
    _train(tmp_path / "chain", 2, 1, 12, "--precision=fp16", f"--run-dir={tmp_path / 'run'}", entrypoint=LOUD)
    whole, chain = ck.resolve(tmp_path / "1x1").manifest, ck.resolve(tmp_path / "chain").manifest
    assert whole.loss_scale is not None and whole.loss_scale.scale < 2.0**13
    assert chain.loss_scale == whole.loss_scale
    assert ck.diff(ck.resolve(tmp_path / "1x1"), ck.resolve(tmp_path / "chain"))["max_rel"] <= 1e-2
    written = events_of(read_progress(GenerationDir(tmp_path / "run").progress_file(0)), CheckpointWritten)
    assert written and all(e.stall_seconds is not None and e.stall_seconds >= 0 for e in written)


def _optimizer_states(checkpoint: ck.Checkpoint) -> dict[str, dict[str, object]]:
    states: dict[str, dict[str, object]] = {}
    for entry in checkpoint.manifest.files:
        payload = ck.load_tensors(checkpoint, set(entry.tensors))[entry.path]
        states.update(payload["optimizer"])
    return states
