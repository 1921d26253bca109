"""GPU benchmark: the runtime on CUDA against its CPU reference, a plain PyTorch loop and the planner.

``python bench/gpu_bench.py`` on a machine with a GPU measures, in one run:
(1) a 1x1 float64 run on CUDA against the CPU reference (max relative error, bound 1e-9);
(2) the bf16 loss curve against fp32 on CUDA;
(3) a checkpoint written on the GPU (in the background) resumed in a CPU 2x2 layout, against the reference;
(4) ``spotmorph train`` 1x1 bf16 on a ~355M-parameter GPT against a plain PyTorch loop of the same model,
batch and optimizer, with the model-FLOPs utilisation of both;
(5) layout-free dropout against ``torch.nn.functional.dropout``;
(6) the planner's per-stage memory against the peak measured on the GPU.
It prints a markdown section and updates it in docs/benchmarks.md. Without CUDA it prints
``no CUDA device: skipped`` and exits 0, which is why ``make bench`` (bench/run_all.py) does not run it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, replace_section, spotmorph

HEADING = "## GPU runtime (`bench/gpu_bench.py`)"
TINY = "examples/tiny_gpt.py:build_tiny"
DEMO = "examples/tiny_gpt.py:build"
GPT350M = "bench/gpu_models.py:build_gpt350m"
GPT_MID = "bench/gpu_models.py:build_gpt_mid"
# Dense bf16 tensor-core peaks (NVIDIA datasheets), matched against torch.cuda.get_device_name().
PEAK_BF16_FLOPS = (
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10", 125e12),
)


def _train(work: Path, name: str, entry: str, *flags: str, stages: int = 1, replicas: int = 1) -> Path:
    """One ``spotmorph train`` run into ``work/name``; returns its run dir (progress files)."""
    run_dir = work / f"run-{name}"
    cmd = spotmorph(
        "train",
        entry,
        f"--stages={stages}",
        f"--replicas={replicas}",
        f"--checkpoint-dir={work / name}",
        f"--run-dir={run_dir}",
        *flags,
    )
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return run_dir


def _events(run_dir: Path, kind: type) -> list[Any]:
    from worker_agent.contract import GenerationDir, events_of, read_progress

    return events_of(read_progress(GenerationDir(run_dir).progress_file(0)), kind)


def _diff(a: Path, b: Path) -> dict[str, Any]:
    from worker_agent.runtime import checkpoint as ck

    return ck.diff(ck.resolve(a), ck.resolve(b))


def exactness(work: Path) -> list[str]:
    """(1) and (3): float64 on the GPU, and a GPU checkpoint resumed on CPUs, against the CPU reference."""
    from worker_agent.contract import CheckpointWritten

    common = ("--global-batch=7", "--micro-batch-size=2", "--dtype=float64")
    _train(work, "cpu-ref", TINY, *common, "--steps=20", "--device=cpu")
    _train(work, "gpu", TINY, *common, "--steps=20", "--device=cuda")
    one = _diff(work / "cpu-ref", work / "gpu")
    flags = ("--steps=10", "--device=cuda", "--background-checkpoint", "--checkpoint-interval=5")
    run_dir = _train(work, "morph", TINY, *common, *flags)
    # Step 5's checkpoint is written while training goes on; the last one (step 10) is waited for.
    stall = next(e.stall_seconds or 0.0 for e in _events(run_dir, CheckpointWritten) if e.step == 5)
    _train(work, "morph", TINY, *common, "--steps=20", "--device=cpu", stages=2, replicas=2)
    morph = _diff(work / "cpu-ref", work / "morph")
    ok = one["max_rel"] <= 1e-9 and morph["max_rel"] <= 1e-9
    return [
        "| check (tiny GPT, float64, B=7, 20 steps) | max relative error | bound |",
        "|---|---|---|",
        f"| 1x1 on CUDA vs 1x1 on CPU | {one['max_rel']:.1e} | 1e-9 |",
        f"| 1x1 on CUDA to step 10, then 2x2 on CPU to 20, vs 1x1 on CPU | {morph['max_rel']:.1e} | 1e-9 |",
        "",
        f"Within bounds: {'yes' if ok else 'NO'}. Training paused {stall * 1e3:.1f} ms for the checkpoint of step "
        "5 on the GPU (copy to pinned host memory; the write ran in the background).",
    ]


def loss_curves(work: Path) -> list[str]:
    """(2): the demo model in bf16 and fp32 on CUDA, same seed and data."""
    from worker_agent.contract import StepCompleted

    curves = {}
    for precision in ("fp32", "bf16"):
        flags = ("--global-batch=16", "--steps=300", "--checkpoint-interval=0", f"--precision={precision}")
        run_dir = _train(work, f"curve-{precision}", DEMO, *flags, "--device=cuda")
        curves[precision] = {e.step: e.loss for e in _events(run_dir, StepCompleted)}
    rows = ["| step | fp32 loss | bf16 loss | difference |", "|---|---|---|---|"]
    for step in (1, 50, 100, 200, 300):
        a, b = curves["fp32"][step], curves["bf16"][step]
        rows.append(f"| {step} | {a:.4f} | {b:.4f} | {(b - a) / a:+.1%} |")
    return rows


def _peak_flops() -> tuple[str, float | None]:
    import torch

    name = torch.cuda.get_device_name(0)
    return name, next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def _flops_per_sample(entry: str) -> float:
    """Training FLOPs of one sample: 6 x matmul parameters x tokens + 12 x blocks x width x tokens^2."""
    from torch import nn

    from worker_agent.runtime.entrypoint import build_spec

    spec = build_spec(entry, 0, check=False)
    seq_len = int(spec.dataset[0][0].shape[0])  # type: ignore[union-attr]
    weights = {
        id(m.weight): m.weight.numel() for _, layer in spec.layers for m in layer.modules() if isinstance(m, nn.Linear)
    }
    blocks = [layer for name, layer in spec.layers if name.startswith("block")]
    width = next(m.normalized_shape[0] for m in blocks[0].modules() if isinstance(m, nn.LayerNorm))
    return 6.0 * sum(weights.values()) * seq_len + 12.0 * len(blocks) * width * seq_len**2


def plain_loop_seconds(entry: str, batch: int, micro: int, steps: int, warmup: int) -> float:
    """Median step time of a plain PyTorch loop: the same layers, optimizer, clipping, batch and autocast."""
    import torch
    from torch import nn

    from worker_agent.runtime.entrypoint import build_spec

    spec = build_spec(entry, 0, check=False)
    model = nn.Sequential(*[layer for _, layer in spec.layers]).cuda().train()
    optimizer = spec.optimizer([(n, p) for n, p in model.named_parameters()])
    times = []
    for step in range(steps):
        rows = range(step * batch, (step + 1) * batch)
        items = [spec.dataset[i] for i in rows]
        x = torch.stack([torch.as_tensor(i[0]) for i in items]).cuda()
        y = torch.stack([i[1] for i in items]).cuda()
        torch.cuda.synchronize()
        began = time.perf_counter()
        for lo in range(0, batch, micro):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = spec.loss(model(x[lo : lo + micro]), y[lo : lo + micro]).sum() / batch
            torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return statistics.median(times[warmup:])


def throughput(work: Path) -> list[str]:
    """(4): samples/s of spotmorph train 1x1 bf16 and of the plain loop, with MFU."""
    from worker_agent.contract import StepCompleted

    batch, micro, steps, warmup = 16, 8, 25, 5
    flags = (f"--global-batch={batch}", f"--micro-batch-size={micro}", f"--steps={steps}", "--checkpoint-interval=0")
    run_dir = _train(work, "gpt350m", GPT350M, *flags, "--precision=bf16", "--device=cuda")
    ours = statistics.median(e.step_seconds for e in _events(run_dir, StepCompleted) if e.step > warmup)
    plain = plain_loop_seconds(f"{ROOT}/{GPT350M}", batch, micro, steps, warmup)
    name, peak = _peak_flops()
    flops = _flops_per_sample(f"{ROOT}/{GPT350M}") * batch
    rows = ["| training loop | step (ms) | samples/s | TFLOP/s | MFU |", "|---|---|---|---|---|"]
    for label, seconds in (("spotmorph train 1x1", ours), ("plain PyTorch loop", plain)):
        mfu = f"{flops / seconds / peak:.1%}" if peak else "n/a"
        rows.append(f"| {label} | {seconds * 1e3:.0f} | {batch / seconds:.1f} | {flops / seconds / 1e12:.0f} | {mfu} |")
    rows += [
        "",
        f"GPT 24x1024 (355M parameters, tied head), 1024 tokens, B={batch} in micro-batches of {micro}, AdamW, "
        f"clipping at 1.0, bf16 autocast over fp32 masters, on {name}; median step of steps {warmup + 1}..{steps}. "
        f"spotmorph / plain step time: {ours / plain:.2f}. MFU = (6 x matmul parameters x tokens + "
        "12 x blocks x width x tokens^2) / step time / the GPU's dense bf16 peak"
        + ("" if peak else " (unknown for this GPU)")
        + ".",
    ]
    return rows


def dropout_rows() -> list[str]:
    """(5): one dropout of a [8, 1024, 1024] bf16 activation, layout-free against torch's."""
    import torch

    from worker_agent.runtime.device import median_seconds
    from worker_agent.runtime.dropout import apply_dropout

    device = torch.device("cuda", 0)
    x = torch.randn(8, 1024, 1024, device=device, dtype=torch.bfloat16)
    ids = torch.arange(8, device=device)
    ours = median_seconds(lambda: apply_dropout(x, ids, 1, 2, 3, 0.1), 50, device)
    theirs = median_seconds(lambda: torch.nn.functional.dropout(x, 0.1, True), 50, device)
    return [
        "| dropout of 8 x 1024 x 1024 bf16, p=0.1 | ms | ratio |",
        "|---|---|---|",
        f"| torch.nn.functional.dropout | {theirs * 1e3:.3f} | 1.00 |",
        f"| layout-free (counter-based hash, int64 tensor ops) | {ours * 1e3:.3f} | {ours / theirs:.2f} |",
    ]


def memory_rows() -> list[str]:
    """(6): predicted (profile on this GPU + planner) against measured peak per stage."""
    import torch

    from morphing.layout import make_layout
    from morphing.planner import Plan, Planner
    from morphing.profile import parse_profile
    from morphing.stages import compare_memory
    from worker_agent.runtime.memory import StageMemoryRequest, measure_stage_peaks
    from worker_agent.runtime.profiler import ProfileRequest, build_profile

    entry, batch, micro = f"{ROOT}/{GPT_MID}", 32, 4
    request = ProfileRequest(entry, (micro,), repeats=3, network=False, device="cuda", precision="bf16")
    profile = parse_profile(json.dumps(build_profile(request)))
    rows = [
        "| layout | recomputation | stage | predicted (GiB) | measured (GiB) | error |",
        "|---|---|---|---|---|---|",
    ]
    for stages in (1, 2, 4):
        for recompute in (False, True):
            layout = make_layout(
                num_layers=len(profile.layers),
                pipeline_stages=stages,
                data_parallel=1,
                micro_batch_size=micro,
                global_batch=batch,
            )
            plan = Planner(profile, batch, recomputation=recompute, gpu_memory_bytes=2**50).evaluate(layout)
            assert isinstance(plan, Plan), plan
            measured = measure_stage_peaks(
                StageMemoryRequest(entry, layout, precision="bf16", recomputation=recompute), torch.device("cuda", 0)
            )
            for check in compare_memory(plan.stage_memory, measured):
                rows.append(
                    f"| {stages}x1 | {'yes' if recompute else 'no'} | {check.stage} | {check.predicted / 2**30:.2f} "
                    f"| {check.measured / 2**30:.2f} | {check.error:+.0%} |"
                )
    return rows


def run() -> str:
    import torch

    name, _ = _peak_flops()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        work = Path(tmp)
        exact = exactness(work)
        curves = loss_curves(work)
        speed = throughput(work)
    return "\n".join(
        [
            HEADING,
            "",
            f"On {name} (torch {torch.__version__}); every figure comes from one run of `python bench/gpu_bench.py`.",
            "",
            "Exactness: the device is one more thing the result must not depend on.",
            "",
            *exact,
            "",
            "bf16 against fp32 (demo model, B=16, seed 0, 1x1 on CUDA): the loss of the same steps.",
            "",
            *curves,
            "",
            "Throughput against a plain PyTorch loop in the same run:",
            "",
            *speed,
            "",
            "Layout-free dropout against torch's (which draws from the CUDA generator and cannot be layout-free):",
            "",
            *dropout_rows(),
            "",
            "Memory: a profile calibrated on this GPU (bf16, GPT 8x768, 512 tokens, m=4, B=32, 1F1B) and the "
            "planner's per-stage model, against each stage replayed alone on the GPU with its in-flight "
            "micro-batches (`worker_agent.runtime.memory.measure_stage_peaks`). Error = (predicted - measured) "
            "/ measured.",
            "",
            *memory_rows(),
        ]
    )


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    section = run()
    print(section)
    replace_section(HEADING, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
