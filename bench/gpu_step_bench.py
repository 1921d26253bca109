"""The step time of ``spotmorph train`` 1x1 bf16 against a plain PyTorch loop on a GPU, and where it goes.

``python bench/gpu_step_bench.py [--baseline TREE] [--profile-dir DIR] [--sizes 355m,large]`` measures, per
model: ``spotmorph train``'s median step (``StepCompleted.step_seconds`` after the warm-up), the plain loop's
(:func:`bench.gpu_bench.plain_loop_seconds`: the same layers, optimizer, clipping, batch and autocast) with
its peak device memory, and both MFUs. ``--baseline TREE`` (a ``git archive`` or worktree of an earlier
commit) runs that tree's ``spotmorph train`` of the first model too, in the same session, so a change's
effect is a ratio measured side by side. A profiled run of the first model (``SPOTMORPH_PROFILE_STEPS``,
:mod:`worker_agent.runtime.profiling.step_profile`) counts the host's waits for the device per step and keeps the
device's top ops (in ``--profile-dir``). ``355m`` is GPT-2 medium's shape, ``large`` 3.8B parameters (more
than half of the GPU's memory). Writes docs/benchmarks.md; ``--smoke`` runs toy sizes on any device and
only prints (tests/bench runs it on a CPU, so a GPU run does not stop at a wrong call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, publish, spotmorph
from bench.gpu_bench import GPT350M, GPT_SMOKE, Setup, _flops_per_sample, _peak_flops, plain_loop_seconds

HEADING = "## GPU step time against plain PyTorch (`bench/gpu_step_bench.py`)"
GPT_LARGE = "bench/gpu_models.py:build_gpt_large"


@dataclass(frozen=True)
class Size:
    key: str
    label: str
    setup: Setup


SIZES = {
    "355m": Size("355m", "GPT 24x1024 (355M), B=16, m=8", Setup("cuda", model=GPT350M, batch=16, micro=8)),
    "large": Size(
        "large",
        "GPT 32x3072 (3.8B), B=16, m=4",
        Setup("cuda", model=GPT_LARGE, batch=16, micro=4, steps=9, warmup=3),
    ),
}


def smoke_size(device: str) -> Size:
    return Size("smoke", "GPT 2x32 (toy)", Setup(device, model=GPT_SMOKE, batch=4, micro=2, steps=6, warmup=2))


def train_seconds(work: Path, setup: Setup, tree: Path, env: dict[str, str] | None = None) -> float:
    """Median step of ``spotmorph train`` 1x1 bf16 from source ``tree`` after the warm-up steps."""
    from worker_agent.contract import GenerationDir, StepCompleted, events_of, read_progress

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    cmd = spotmorph(
        "train",
        f"{ROOT}/{setup.model}",
        "--stages=1",
        "--replicas=1",
        f"--global-batch={setup.batch}",
        f"--micro-batch-size={setup.micro}",
        f"--steps={setup.steps}",
        "--checkpoint-interval=0",
        "--precision=bf16",
        f"--device={setup.device}",
        f"--checkpoint-dir={run_dir / 'ckpt'}",
        f"--run-dir={run_dir}",
    )
    env = {**os.environ, **(env or {})}
    if tree != ROOT:  # the baseline's packages first, in every process the command starts
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *env.get("PYTHONPATH", "").split(os.pathsep)])
    result = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} in {tree} exited {result.returncode}:\n{result.stderr[-3000:]}")
    steps = events_of(read_progress(GenerationDir(run_dir).progress_file(0)), StepCompleted)
    return statistics.median(e.step_seconds for e in steps if e.step > setup.warmup)


def plain_seconds(setup: Setup) -> tuple[float, float | None]:
    """The plain loop's median step and its peak device memory (GB; None on a CPU)."""
    import torch

    cuda = setup.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    seconds = plain_loop_seconds(f"{ROOT}/{setup.model}", setup)
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else None
    if cuda:
        torch.cuda.empty_cache()
    return seconds, peak


def size_rows(work: Path, size: Size, baseline: Path | None) -> list[str]:
    setup = size.setup
    runs: list[tuple[str, float]] = []
    if baseline is not None:
        runs.append((f"spotmorph train 1x1, before ({baseline.name})", train_seconds(work, setup, baseline)))
    ours = train_seconds(work, setup, ROOT)
    runs.append(("spotmorph train 1x1", ours))
    print(f"{size.label}: spotmorph train {ours * 1e3:.1f} ms a step", file=sys.stderr, flush=True)
    plain, peak = plain_seconds(setup)
    runs.append(("plain PyTorch loop", plain))
    _, flops_peak = _peak_flops(setup)
    flops = _flops_per_sample(f"{ROOT}/{setup.model}") * setup.batch
    rows = []
    for label, seconds in runs:
        mfu = f"{flops / seconds / flops_peak:.1%}" if flops_peak else "n/a"
        rows.append(f"| {size.label} | {label} | {seconds * 1e3:.1f} | {seconds / plain:.3f} | {mfu} |")
    memory = f"{peak:.1f} GB" if peak is not None else "n/a (CPU)"
    rows.append(f"| {size.label} | plain loop's peak device memory | {memory} | | |")
    return rows


def profile_rows(work: Path, size: Size, out: Path) -> list[str]:
    """Host waits per step and the device's top ops, from one profiled run of ``size``."""
    setup = replace(size.setup, steps=8, warmup=3)
    env = {"SPOTMORPH_PROFILE_STEPS": "4:7", "SPOTMORPH_PROFILE_DIR": str(out)}
    train_seconds(work, setup, ROOT, env)
    summary = json.loads((out / "profile-rank0.json").read_text())
    table = (out / "profile-rank0.txt").read_text().splitlines()
    return [
        f"Profiled steps {summary['steps'][0]}..{summary['steps'][1]} of {size.label} "
        f"(`SPOTMORPH_PROFILE_STEPS=4:7`): {summary['host_waits_per_step']:g} host waits a step "
        f"({summary['host_waits_by_call'] or 'none'}). Top ops by self device time:",
        "",
        "```",
        *table[:16],
        "```",
    ]


def shown(rows: list[str]) -> list[str]:
    """``rows``, printed to stderr as soon as they exist: a later model that runs out of time hides nothing."""
    print(*rows, sep="\n", file=sys.stderr, flush=True)
    return rows


def run(sizes: list[Size], baseline: Path | None, profile_dir: Path | None, smoke: bool, profiled: bool = True) -> str:
    import torch

    name, _ = _peak_flops(sizes[0].setup)
    rows = ["| model | training loop | step (ms) | / plain | MFU |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="gpu-step-") as tmp:
        work = Path(tmp)
        rows += shown(size_rows(work, sizes[0], baseline))  # the baseline beside the first model only
        profile = shown(profile_rows(work, sizes[0], profile_dir or work / "profile")) if profiled else []
        for size in sizes[1:]:
            rows += shown(size_rows(work, size, None))
    how = "`python bench/gpu_step_bench.py --smoke`: toy sizes, not a measurement" if smoke else "one run"
    return "\n".join(
        [
            HEADING,
            "",
            f"On {name} (torch {torch.__version__}), {how}. bf16 autocast over fp32 masters, AdamW, clipping at "
            "1.0, 1024 tokens; the median step after the warm-up; / plain: step time over the plain loop's in "
            "the same run. MFU: (6 x matmul parameters x tokens + 12 x blocks x width x tokens^2) / step / the "
            "GPU's dense bf16 peak.",
            "",
            *rows,
            "",
            *profile,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="355m,large", help="comma-separated: " + ", ".join(SIZES))
    parser.add_argument("--baseline", type=Path, help="the source tree of an earlier commit, run side by side")
    parser.add_argument("--profile-dir", type=Path, help="where the profiled run's files go (default: a temp dir)")
    parser.add_argument("--no-profile", action="store_true", help="leave out the profiled run (prints only)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on any device; print only")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("no CUDA device: skipped")
        return 0
    unknown = [s for s in args.sizes.split(",") if s not in SIZES]
    if unknown:
        parser.error(f"unknown --sizes {unknown}; choose from {', '.join(SIZES)}")
    if args.baseline is not None and not (args.baseline / "spotmorph" / "cli.py").is_file():
        parser.error(f"--baseline {args.baseline} is not a spotmorph source tree (no spotmorph/cli.py in it)")
    device = "cuda" if cuda else "cpu"
    sizes = [smoke_size(device)] if args.smoke else [SIZES[s] for s in args.sizes.split(",")]
    baseline = args.baseline.resolve() if args.baseline else None
    section = run(sizes, baseline, args.profile_dir, args.smoke, not args.no_profile)
    publish(HEADING, section, not (args.smoke or args.no_profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
