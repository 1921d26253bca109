"""GPU benchmark: the runtime on CUDA against its CPU reference, a plain PyTorch loop and the planner.

``python bench/gpu_bench.py`` on a GPU measures in one run: (1) a 1x1 float64 run on CUDA against the CPU
reference (bound 1e-9); (2) bf16's loss curve against fp32; (3) a GPU checkpoint (written in the background)
resumed in a CPU 2x2 layout; (4) ``spotmorph train`` 1x1 bf16 on a ~355M GPT against a plain PyTorch loop,
with both MFUs; (5) layout-free dropout against torch's; (6) the planner's per-stage memory against the
GPU's measured peaks. It prints a markdown section (each part on stderr as it ends; a failed part is one
line and exit 1) and updates docs/benchmarks.md. Without CUDA it prints ``no CUDA device: skipped``.

``--smoke`` runs every part at toy sizes on whatever device there is and only prints; CI runs it
(tests/runtime/test_gpu.py), so the first run on a GPU does not stop at a wrong call in this file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, publish, spotmorph

HEADING = "## GPU runtime (`bench/gpu_bench.py`)"
TINY = "examples/tiny_gpt.py:build_tiny"
DEMO = "examples/tiny_gpt.py:build"
GPT350M = "bench/gpu_models.py:build_gpt350m"
GPT_MID = "bench/gpu_models.py:build_gpt_mid"
GPT_SMOKE = "bench/gpu_models.py:build_gpt_smoke"
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


@dataclass(frozen=True)
class Setup:
    """Where the bench runs and how big: the real run on CUDA, or the smoke run at toy sizes."""

    device: str  # the --device every GPU-side run gets: cuda, or cpu for a smoke run without one
    exact_steps: int = 20
    curve_steps: int = 300
    curve_rows: tuple[int, ...] = (1, 50, 100, 200, 300)
    model: str = GPT350M
    model_label: str = "GPT 24x1024 (355M parameters, tied head), 1024 tokens"
    batch: int = 16
    micro: int = 8
    steps: int = 25
    warmup: int = 5
    dropout_rounds: int = 50
    memory_model: str = GPT_MID
    memory_batch: int = 32
    memory_micro: int = 4
    memory_stages: tuple[int, ...] = (1, 2, 4)

    @property
    def torch_device(self) -> Any:
        import torch

        return torch.device(self.device, 0) if self.device == "cuda" else torch.device("cpu")


FULL = Setup("cuda")


def smoke_setup(device: str) -> Setup:
    return Setup(
        device,
        exact_steps=6,
        curve_steps=8,
        curve_rows=(1, 4, 8),
        model=GPT_SMOKE,
        model_label="GPT 2x32 (toy), 16 tokens",
        batch=4,
        micro=2,
        steps=6,
        warmup=2,
        dropout_rounds=3,
        memory_model=GPT_SMOKE,
        memory_batch=8,
        memory_micro=2,
        memory_stages=(1, 2),
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
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return run_dir


def _events(run_dir: Path, kind: type) -> list[Any]:
    from worker_agent.contract import GenerationDir, events_of, read_progress

    return events_of(read_progress(GenerationDir(run_dir).progress_file(0)), kind)


def _diff(a: Path, b: Path) -> dict[str, Any]:
    from worker_agent.runtime.storage import checkpoint as ck

    return ck.diff(ck.resolve(a), ck.resolve(b))


def exactness(work: Path, setup: Setup) -> list[str]:
    """(1) and (3): float64 on the GPU, and a GPU checkpoint resumed on CPUs, against the CPU reference."""
    from worker_agent.contract import CheckpointWritten

    common = ("--global-batch=7", "--micro-batch-size=2", "--dtype=float64")
    last, half = setup.exact_steps, setup.exact_steps // 2
    on = f"--device={setup.device}"
    _train(work, "cpu-ref", TINY, *common, f"--steps={last}", "--device=cpu")
    _train(work, "gpu", TINY, *common, f"--steps={last}", on)
    one = _diff(work / "cpu-ref", work / "gpu")
    flags = (f"--steps={half}", on, "--background-checkpoint", f"--checkpoint-interval={half // 2}")
    run_dir = _train(work, "morph", TINY, *common, *flags)
    # The first checkpoint is written while training goes on; the last one is waited for.
    stalls = {e.step: e.stall_seconds for e in _events(run_dir, CheckpointWritten)}
    stall = stalls.get(half // 2)
    if stall is None:
        raise RuntimeError(f"no stall recorded for the checkpoint of step {half // 2}: {stalls}")
    _train(work, "morph", TINY, *common, f"--steps={last}", "--device=cpu", stages=2, replicas=2)
    morph = _diff(work / "cpu-ref", work / "morph")
    ok = one["max_rel"] <= 1e-9 and morph["max_rel"] <= 1e-9
    where = setup.device.upper() if setup.device == "cuda" else setup.device
    return [
        f"| check (tiny GPT, float64, B=7, {last} steps) | max relative error | bound |",
        "|---|---|---|",
        f"| 1x1 on {where} vs 1x1 on CPU | {one['max_rel']:.1e} | 1e-9 |",
        f"| 1x1 on {where} to step {half}, then 2x2 on CPU to {last}, vs 1x1 on CPU | {morph['max_rel']:.1e} | 1e-9 |",
        "",
        f"Within bounds: {'yes' if ok else 'NO'}. Training paused {stall * 1e3:.1f} ms for the checkpoint of step "
        f"{half // 2} on {where} (copy to pinned host memory; the write ran in the background).",
    ]


def loss_curves(work: Path, setup: Setup) -> list[str]:
    """(2): the demo model in bf16 and fp32 on the device, same seed and data."""
    from worker_agent.contract import StepCompleted

    curves = {}
    for precision in ("fp32", "bf16"):
        flags = ("--global-batch=16", f"--steps={setup.curve_steps}", "--checkpoint-interval=0")
        run_dir = _train(
            work, f"curve-{precision}", DEMO, *flags, f"--precision={precision}", f"--device={setup.device}"
        )
        curves[precision] = {e.step: e.loss for e in _events(run_dir, StepCompleted)}
    rows = ["| step | fp32 loss | bf16 loss | difference |", "|---|---|---|---|"]
    for step in setup.curve_rows:
        a, b = curves["fp32"][step], curves["bf16"][step]
        rows.append(f"| {step} | {a:.4f} | {b:.4f} | {(b - a) / a:+.1%} |")
    return rows


def _peak_flops(setup: Setup) -> tuple[str, float | None]:
    import torch

    if setup.device != "cuda":
        return "CPU", None
    name = torch.cuda.get_device_name(0)
    return name, next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def _flops_per_sample(entry: str) -> float:
    """Training FLOPs of one sample: 6 x matmul parameters x tokens + 12 x blocks x width x tokens^2."""
    from torch import nn

    from worker_agent.runtime.model.entrypoint import build_spec

    spec = build_spec(entry, 0, check=False)
    seq_len = int(spec.dataset[0][0].shape[0])  # type: ignore[union-attr]
    weights = {
        id(m.weight): m.weight.numel() for _, layer in spec.layers for m in layer.modules() if isinstance(m, nn.Linear)
    }
    blocks = [layer for name, layer in spec.layers if name.startswith("block")]
    width = next(m.normalized_shape[0] for m in blocks[0].modules() if isinstance(m, nn.LayerNorm))
    return 6.0 * sum(weights.values()) * seq_len + 12.0 * len(blocks) * width * seq_len**2


def plain_loop_seconds(entry: str, setup: Setup) -> float:
    """Median step time of a plain PyTorch loop: the same layers, optimizer, clipping, batch and autocast."""
    import torch
    from torch import nn

    from worker_agent.runtime.model.entrypoint import build_spec
    from worker_agent.runtime.numerics.device import synchronize

    device, batch, micro = setup.torch_device, setup.batch, setup.micro
    spec = build_spec(entry, 0, check=False)
    model = nn.Sequential(*[layer for _, layer in spec.layers]).to(device).train()
    optimizer = spec.optimizer([(n, p) for n, p in model.named_parameters()])
    times = []
    for step in range(setup.steps):
        rows = range(step * batch, (step + 1) * batch)
        items = [spec.dataset[i] for i in rows]
        x = torch.stack([torch.as_tensor(i[0]) for i in items]).to(device)
        y = torch.stack([i[1] for i in items]).to(device)
        synchronize(device)
        began = time.perf_counter()
        for lo in range(0, batch, micro):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = spec.loss(model(x[lo : lo + micro]), y[lo : lo + micro]).sum() / batch
            torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip_grad_norm or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times[setup.warmup :])


def throughput(work: Path, setup: Setup) -> list[str]:
    """(4): samples/s of spotmorph train 1x1 bf16 and of the plain loop, with MFU."""
    from worker_agent.contract import StepCompleted

    batch, micro, steps, warmup = setup.batch, setup.micro, setup.steps, setup.warmup
    flags = (f"--global-batch={batch}", f"--micro-batch-size={micro}", f"--steps={steps}", "--checkpoint-interval=0")
    run_dir = _train(work, "throughput", setup.model, *flags, "--precision=bf16", f"--device={setup.device}")
    ours = statistics.median(e.step_seconds for e in _events(run_dir, StepCompleted) if e.step > warmup)
    plain = plain_loop_seconds(f"{ROOT}/{setup.model}", setup)
    name, peak = _peak_flops(setup)
    flops = _flops_per_sample(f"{ROOT}/{setup.model}") * batch
    rows = ["| training loop | step (ms) | samples/s | TFLOP/s | MFU |", "|---|---|---|---|---|"]
    for label, seconds in (("spotmorph train 1x1", ours), ("plain PyTorch loop", plain)):
        mfu = f"{flops / seconds / peak:.1%}" if peak else "n/a"
        rows.append(f"| {label} | {seconds * 1e3:.0f} | {batch / seconds:.1f} | {flops / seconds / 1e12:.2f} | {mfu} |")
    rows += [
        "",
        f"{setup.model_label}, B={batch} in micro-batches of {micro}, AdamW, clipping at 1.0, bf16 autocast "
        f"over fp32 masters, on {name}; median "
        f"step of steps {warmup + 1}..{steps}. spotmorph / plain step time: {ours / plain:.2f}. MFU = (6 x matmul "
        "parameters x tokens + 12 x blocks x width x tokens^2) / step time / the GPU's dense bf16 peak"
        + ("" if peak else " (unknown here)")
        + ".",
    ]
    return rows


def dropout_rows(setup: Setup) -> list[str]:
    """(5): layout-free dropout against torch's, one op and a whole step (``bench/dropout_bench.py``)."""
    from bench import dropout_bench

    device, rounds = setup.torch_device, setup.dropout_rounds
    compiled = setup.device == "cuda"  # the compiled kernel is for CUDA (on a CPU it costs seconds to build)
    return [*dropout_bench.op_rows(device, compiled, rounds), "", *dropout_bench.step_rows(device, compiled, rounds)]


def memory_rows(setup: Setup) -> list[str]:
    """(6): predicted (profile on this device + planner) against measured peak per stage (CUDA only)."""
    from morphing.layout import make_layout
    from morphing.planner import Plan, Planner
    from morphing.profile import parse_profile
    from morphing.stages import compare_memory
    from worker_agent.runtime.profiling.memory import StageMemoryRequest, measure_stage_peaks
    from worker_agent.runtime.profiling.profiler import ProfileRequest, build_profile

    entry, batch, micro = f"{ROOT}/{setup.memory_model}", setup.memory_batch, setup.memory_micro
    request = ProfileRequest(
        entry, (micro,), repeats=3, network=False, device="cuda" if setup.device == "cuda" else "cpu", precision="bf16"
    )
    profile = parse_profile(json.dumps(build_profile(request)))
    rows = [
        "| layout | recomputation | stage | predicted (GiB) | measured (GiB) | error |",
        "|---|---|---|---|---|---|",
    ]
    for stages in setup.memory_stages:
        for recompute in (False, True):
            layout = make_layout(
                num_layers=len(profile.layers),
                pipeline_stages=stages,
                data_parallel=1,
                micro_batch_size=micro,
                global_batch=batch,
            )
            plan = Planner(profile, batch, recomputation=recompute, gpu_memory_bytes=2**50).evaluate(layout)
            if not isinstance(plan, Plan):
                raise RuntimeError(f"the planner refused {stages}x1: {plan}")
            label = f"| {stages}x1 | {'yes' if recompute else 'no'} "
            if setup.device != "cuda":
                rows += [
                    f"{label}| {s} | {m.total / 2**30:.4f} | n/a (no CUDA) | |" for s, m in enumerate(plan.stage_memory)
                ]
                continue
            memory = StageMemoryRequest(entry, layout, precision="bf16", recomputation=recompute)
            measured = measure_stage_peaks(memory, setup.torch_device)
            for check in compare_memory(plan.stage_memory, measured):
                rows.append(
                    f"{label}| {check.stage} | {check.predicted / 2**30:.2f} "
                    f"| {check.measured / 2**30:.2f} | {check.error:+.0%} |"
                )
    return rows


def _part(name: str, measure: Callable[[], list[str]]) -> list[str]:
    """One part of the bench: its rows, printed to stderr as soon as they exist (a later part that hangs
    or fails hides nothing), or one line saying how it failed."""
    started = time.perf_counter()
    try:
        rows = measure()
    except Exception as exc:  # one part's failure is reported, the others still run
        rows = [f"**{name} failed**: {type(exc).__name__}: {str(exc)[-2000:]}"]
    print(f"--- {name} ({time.perf_counter() - started:.0f} s)", *rows, sep="\n", file=sys.stderr, flush=True)
    return rows


def run(setup: Setup) -> str:
    import torch

    name, _ = _peak_flops(setup)
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        work = Path(tmp)
        exact = _part("exactness", lambda: exactness(work, setup))
        curves = _part("loss curves", lambda: loss_curves(work, setup))
        speed = _part("throughput", lambda: throughput(work, setup))
    dropout = _part("dropout", lambda: dropout_rows(setup))
    memory = _part("memory", lambda: memory_rows(setup))
    smoke = setup != FULL
    return "\n".join(
        [
            HEADING,
            "",
            f"On {name} (torch {torch.__version__}); every figure comes from one run of "
            + (
                "`python bench/gpu_bench.py --smoke` at toy sizes: not a measurement."
                if smoke
                else "`python bench/gpu_bench.py`."
            ),
            "",
            "Exactness: the device is one more thing the result must not depend on.",
            "",
            *exact,
            "",
            f"bf16 against fp32 (demo model, B=16, seed 0, 1x1 on {name}): the loss of the same steps.",
            "",
            *curves,
            "",
            "Throughput against a plain PyTorch loop in the same run:",
            "",
            *speed,
            "",
            "Layout-free dropout against torch's (which draws from the device's generator and cannot be layout-free):",
            "",
            *dropout,
            "",
            "Memory: a profile calibrated on this GPU (bf16, GPT 8x768, 512 tokens, m=4, B=32, 1F1B) and the "
            "planner's per-stage model, against each stage replayed alone on the GPU with its in-flight "
            "micro-batches (`worker_agent.runtime.profiling.memory.measure_stage_peaks`). Error = (predicted - "
            "measured) / measured.",
            "",
            *memory,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="toy sizes on any device; print only, write no docs")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("no CUDA device: skipped")
        return 0
    section = run(smoke_setup("cuda" if cuda else "cpu") if args.smoke else FULL)
    publish(HEADING, section, not args.smoke)
    return 1 if "failed**:" in section else 0


if __name__ == "__main__":
    sys.exit(main())
