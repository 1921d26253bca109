"""On a machine with CUDA (``make test-gpu``): the GPU runtime against the CPU reference.

Skipped with a reason elsewhere; the last test is the opposite (what a machine without CUDA sees). The
float64 checks hold the GPU to the same 1e-9 as a layout change: the device is one more thing the result
must not depend on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.runtime.helpers import TINY, run, train, train_cmd
from worker_agent.contract import CheckpointWritten, GenerationDir, StepCompleted, events_of, read_progress
from worker_agent.runtime.storage import checkpoint as ck

pytestmark = pytest.mark.slow
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu on a GPU machine)"
)
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@needs_cuda
def test_float64_on_cuda_equals_the_cpu_reference(tmp_path: Path) -> None:
    train(tmp_path / "gpu", 1, 1, 6, "--device=cuda")
    train(tmp_path / "cpu", 1, 1, 6)
    diff = ck.diff(ck.resolve(tmp_path / "cpu"), ck.resolve(tmp_path / "gpu"))
    assert diff["missing"] == [] and diff["max_rel"] <= 1e-9, diff


@pytest.mark.gpu
@needs_cuda
def test_a_checkpoint_written_on_a_gpu_resumes_in_a_cpu_2x2_layout(tmp_path: Path) -> None:
    root = tmp_path / "morphed"
    flags = ("--device=cuda", "--background-checkpoint", "--checkpoint-interval=2", f"--run-dir={tmp_path / 'run'}")
    train(root, 1, 1, 4, *flags)  # step 2's checkpoint is written while steps 3 and 4 train
    written = events_of(read_progress(GenerationDir(tmp_path / "run").progress_file(0)), CheckpointWritten)
    assert [e.step for e in written] == [2, 4] and all(e.stall_seconds is not None for e in written), written
    train(root, 2, 2, 6, "--device=cpu")
    train(tmp_path / "reference", 1, 1, 6)
    diff = ck.diff(ck.resolve(tmp_path / "reference"), ck.resolve(root))
    assert diff["missing"] == [] and diff["max_rel"] <= 1e-9, diff
    # And back onto the GPU.
    train(root, 1, 1, 8, "--device=cuda")
    train(tmp_path / "reference", 1, 1, 8)
    assert ck.diff(ck.resolve(tmp_path / "reference"), ck.resolve(root))["max_rel"] <= 1e-9


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(GPUS < 4, reason="needs 4 GPUs (one per rank of a 2x2 layout, NCCL)")
def test_a_2x2_nccl_layout_equals_the_cpu_reference(tmp_path: Path) -> None:
    train(tmp_path / "gpu", 2, 2, 6, "--device=cuda")
    train(tmp_path / "cpu", 1, 1, 6)
    assert ck.diff(ck.resolve(tmp_path / "cpu"), ck.resolve(tmp_path / "gpu"))["max_rel"] <= 1e-9


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (one per rank, NCCL)")
@pytest.mark.parametrize(("stages", "replicas"), [(2, 1), (1, 2)])
def test_two_ranks_over_nccl_equal_the_cpu_reference(tmp_path: Path, stages: int, replicas: int) -> None:
    """Pipeline point-to-point (2x1) and the data-parallel all-reduce (1x2) over NCCL, in float64."""
    train(tmp_path / "gpu", stages, replicas, 6, "--device=cuda")
    train(tmp_path / "cpu", 1, 1, 6)
    assert ck.diff(ck.resolve(tmp_path / "cpu"), ck.resolve(tmp_path / "gpu"))["max_rel"] <= 1e-9


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cuda_and_checkpoints_float32(tmp_path: Path, precision: str) -> None:
    run_dir = tmp_path / "run"
    cmd = train_cmd(tmp_path / "c", 1, 1, 30, "--dtype=float32", f"--precision={precision}", "--device=cuda")
    result = run([*cmd, f"--run-dir={run_dir}"])
    assert result.returncode == 0, result.explain()
    losses = [e.loss for e in events_of(read_progress(GenerationDir(run_dir).progress_file(0)), StepCompleted)]
    assert sum(losses[-5:]) < 0.95 * sum(losses[:5]), losses
    floats = {t.dtype for t in ck.read_all(ck.resolve(tmp_path / "c")).values() if t.is_floating_point()}
    assert floats == {torch.float32}


@pytest.mark.gpu
@needs_cuda
def test_profile_on_cuda_records_allocator_peaks(tmp_path: Path) -> None:
    from spotmorph.cli import main

    out = tmp_path / "p.json"
    assert (
        main(
            ["profile", TINY, "--device=cuda", "--micro-batch-sizes=1,2", "--repeats=3", "--no-network", f"--out={out}"]
        )
        == 0
    )
    profile = json.loads(out.read_text())
    assert profile["cluster"]["compute_slots_per_node"] is None
    assert all(layer["peak_memory_bytes_per_sample"] > 0 for layer in profile["layers"])


@pytest.mark.gpu
@needs_cuda
def test_measured_stage_peaks_are_positive_and_recomputation_lowers_them() -> None:
    from morphing.layout import make_layout
    from worker_agent.runtime.profiling.memory import StageMemoryRequest, measure_stage_peaks

    layout = make_layout(num_layers=4, pipeline_stages=2, data_parallel=1, micro_batch_size=4, global_batch=32)
    device = torch.device("cuda", 0)
    plain = measure_stage_peaks(StageMemoryRequest(TINY, layout), device)
    recomputed = measure_stage_peaks(StageMemoryRequest(TINY, layout, recomputation=True), device)
    assert len(plain) == 2 and all(p > 0 for p in plain)
    assert recomputed[0] <= plain[0]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_exact_job_on_cuda_resumed_twice_ends_bitwise_where_one_run_does(tmp_path: Path, precision: str) -> None:
    """Exact mode on CUDA (deterministic kernels, cuBLAS's fixed workspace): a run stopped and resumed at
    steps 12 and 25 ends bit for bit where the uninterrupted one does (one GPU: both 1x1)."""
    from tests.runtime.test_exact import bitwise, exact_train

    flags = ("--device=cuda", f"--precision={precision}")
    exact_train(tmp_path / "reference", 1, 1, 50, *flags)
    for until in (12, 25, 50):
        exact_train(tmp_path / "chain", 1, 1, until, *flags)
    verdict = bitwise(tmp_path / "reference", tmp_path / "chain")
    assert verdict.returncode == 0 and "bitwise equal" in verdict.stdout, verdict.stdout + verdict.stderr


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_a_step_on_cuda_waits_for_the_device_once(tmp_path: Path, precision: str) -> None:
    """The host waits for the GPU once a step (the read of its loss; fp16's overflow test rides along in the
    same copy), counted by torch.profiler over three steps of a clipped model (SPOTMORPH_PROFILE_STEPS)."""
    out = tmp_path / "profile"
    cmd = train_cmd(tmp_path / "c", 1, 1, 8, "--dtype=float32", f"--precision={precision}", "--device=cuda")
    env = {**os.environ, "SPOTMORPH_PROFILE_STEPS": "4:7", "SPOTMORPH_PROFILE_DIR": str(out)}
    result = run([*cmd, "--checkpoint-interval=0"], env=env)
    assert result.returncode == 0, result.explain()
    summary = json.loads((out / "profile-rank0.json").read_text())
    assert summary["device"] == "cuda" and summary["steps"] == [4, 6], summary
    assert summary["host_waits_per_step"] <= 1, (summary, (out / "profile-rank0.txt").read_text())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", ["gpt2_sample", "llama_sample", "qwen2_sample", "mistral_sample"])
def test_an_exact_hf_job_on_cuda_resumed_ends_bitwise_where_one_run_does(tmp_path: Path, family: str) -> None:
    """Exact mode on CUDA for the Hugging Face families (bf16 autocast): every kernel deterministic (torch
    refuses one that is not, and the trainer names it), so a run stopped and resumed at step 10 ends bit for
    bit where the uninterrupted one does."""
    from tests.hf.test_hf_equivalence import MODELS
    from tests.runtime.test_exact import bitwise, exact_train

    entry = f"{MODELS}:{family}"
    flags = ("--device=cuda", "--precision=bf16")
    exact_train(tmp_path / "reference", 1, 1, 20, *flags, entry=entry)
    for until in (10, 20):
        exact_train(tmp_path / "chain", 1, 1, until, *flags, entry=entry)
    verdict = bitwise(tmp_path / "reference", tmp_path / "chain")
    assert verdict.returncode == 0 and "bitwise equal" in verdict.stdout, verdict.stdout + verdict.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what the GPU bench does without a GPU")
def test_the_gpu_bench_skips_without_cuda() -> None:
    """Not a GPU test: it is what CI and `python bench/gpu_bench.py` on a CPU machine see."""
    import subprocess
    import sys

    from tests.runtime.helpers import REPO

    result = subprocess.run(
        [sys.executable, "bench/gpu_bench.py"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "no CUDA device: skipped", result


@pytest.mark.soak  # 90 s of `spotmorph train` runs on two cores; bench/gpu_check.sh runs the real bench on a GPU
def test_the_gpu_bench_smoke_run_exercises_every_part_at_toy_sizes() -> None:
    """Not a GPU test: every part of the GPU bench runs (on CUDA where there is one, else on the CPU), so
    its first run on a GPU does not stop at a wrong call; the smoke run prints and writes no docs."""
    import subprocess
    import sys

    from tests.runtime.helpers import REPO

    docs = (REPO / "docs" / "benchmarks.md").read_text()
    result = subprocess.run(
        [sys.executable, "bench/gpu_bench.py", "--smoke"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result
    out = result.stdout
    assert "Within bounds: yes" in out, out
    assert "not a measurement" in out
    for row in ("| spotmorph train 1x1 |", "| plain PyTorch loop |", "| layout-free", "| 2x1 | yes | 1 |"):
        assert row in out, (row, out)
    curve = {
        int(c[1]): (float(c[2]), float(c[3]))
        for c in (line.split("|") for line in out.splitlines())
        if len(c) == 6 and c[1].strip() in ("1", "8")
    }
    assert curve[8][0] < curve[1][0] and curve[8][1] < curve[1][1], curve  # both losses fall
    assert abs(curve[8][1] - curve[8][0]) < 0.05 * curve[8][0], curve  # and bf16 tracks fp32
    assert (REPO / "docs" / "benchmarks.md").read_text() == docs
