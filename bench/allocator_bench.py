"""Trainers that keep freed memory against glibc's defaults: step time, page faults, peak memory.

``spotmorph train`` of the GPT-2 sizes in :mod:`bench.gpt2_sizes` (float32, global batch 4) at 1x1 and 1x2
(two ranks over gloo), each run once with ``SPOTMORPH_MALLOC=system`` (glibc's defaults: allocations above
the mmap threshold are mapped and unmapped every step) and once with the trainers' default (``keep``,
:mod:`worker_agent.runtime.process.allocator`), alternating, ``--repeats`` times. Per run: rank 0's median
``step_seconds`` after the warm-up steps, the minor page faults and the largest resident size of any process
of the run (``getrusage(RUSAGE_CHILDREN)`` in a process of its own per run: ``spotmorph train`` waits for its
ranks), and keep / system in the same session. ``python bench/allocator_bench.py`` prints the section and
updates it in docs/benchmarks.md (``--no-docs``: print only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, median_step_seconds, publish, spotmorph

HEADING = "## Trainers keep freed memory: step time and page faults against glibc's defaults"
MODES = ("system", "keep")
WARMUP = 3
RUSAGE = """
import json, resource, subprocess, sys
code = subprocess.run(sys.argv[1:], capture_output=True).returncode
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": code, "faults": usage.ru_minflt, "max_rss_kb": usage.ru_maxrss}))
"""


def one(size: str, replicas: int, mode: str, steps: int, work: Path) -> dict[str, float]:
    run_dir = work / f"{size}-{replicas}-{mode}"
    cmd = spotmorph(
        "train",
        f"{ROOT}/bench/gpt2_sizes.py:build_{size}",
        f"--replicas={replicas}",
        "--global-batch=4",
        f"--steps={steps}",
        f"--checkpoint-dir={run_dir / 'ckpt'}",
        f"--run-dir={run_dir}",
        "--checkpoint-interval=0",
        "--device=cpu",
    )
    env = {**os.environ, "SPOTMORPH_MALLOC": mode}
    out = subprocess.run([sys.executable, "-c", RUSAGE, *cmd], cwd=ROOT, env=env, capture_output=True, text=True)
    usage = json.loads(out.stdout.strip().splitlines()[-1])
    if usage["code"] != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {usage['code']} with SPOTMORPH_MALLOC={mode}")
    return {
        "step": median_step_seconds(run_dir, WARMUP),
        "faults": usage["faults"] / steps,
        "rss_mb": usage["max_rss_kb"] / 1024,
    }


def table(rows: dict[tuple[str, int, str], list[dict[str, float]]]) -> list[str]:
    lines = [
        "| model | layout | malloc | step s (median of runs) | minor faults a step | peak RSS MB | keep / system |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for (size, replicas, mode), runs in rows.items():
        step = statistics.median(r["step"] for r in runs)
        base = statistics.median(r["step"] for r in rows[(size, replicas, "system")])
        ratio = f"**{step / base:.2f}**" if mode == "keep" else ""
        faults = statistics.median(r["faults"] for r in runs)
        rss = max(r["rss_mb"] for r in runs)
        lines.append(f"| {size.upper()} | 1x{replicas} | {mode} | {step:.3f} | {faults:,.0f} | {rss:,.0f} | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="43m", help="comma-separated, of 4m, 43m, 120m")
    parser.add_argument("--replicas", default="1,2", help="comma-separated data-parallel widths")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    rows: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="allocator-bench-") as tmp:
        for size in args.sizes.split(","):
            for replicas in map(int, args.replicas.split(",")):
                for repeat in range(args.repeats):
                    for mode in MODES:
                        result = one(size, replicas, mode, args.steps, Path(tmp) / str(repeat))
                        rows.setdefault((size, replicas, mode), []).append(result)
                        print(f"  [allocator_bench] {size} 1x{replicas} {mode}: {result}", file=sys.stderr)
    command = "python bench/allocator_bench.py" + (f" --sizes {args.sizes}" if args.sizes != "43m" else "")
    section = "\n".join(
        [
            HEADING,
            "",
            f"Machine: {machine()}; 1-minute load average {before:.2f} before, {os.getloadavg()[0]:.2f} after.",
            f"Command: `{command}`: `spotmorph train` of bench/gpt2_sizes.py, float32, global batch 4, "
            f"{args.steps} steps, no checkpoint, one torch thread a rank; each row {args.repeats} runs, the two "
            f"modes alternating; step: rank 0's median `step_seconds` after step {WARMUP}; faults and peak RSS: "
            "every process of the run (`getrusage(RUSAGE_CHILDREN)`: the ranks and `spotmorph train`), faults "
            "divided by the steps (start-up included).",
            "",
            *table(rows),
            "",
            "*system*: `SPOTMORPH_MALLOC=system`, glibc's defaults: an allocation above the mmap threshold (at most "
            "32 MB) is mapped and unmapped each time and the heap's free top is trimmed, so every step faults its "
            "large tensors in again, each page zeroed by the kernel; *keep* (the trainers' default, "
            "worker_agent/runtime/process/allocator.py): no mmap for allocations, no trim, freed memory reused by the "
            "next step.",
        ]
    )
    publish(HEADING, section, not args.no_docs)


if __name__ == "__main__":
    main()
