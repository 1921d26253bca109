"""What exact mode costs and what it buys: step time and memory against the normal mode in the same run,
and every mode's distance from a float64 run.

Cost: real ``spotmorph train`` runs of Hugging Face GPT-2 (bench/gpt2_sizes.py: 4M and 43M parameters,
64-token sequences, B = 16, m = 4) in 1x1 and 2x1 (a pipeline), normal then exact, one after the other in
one session on the same machine. Step time: the median of each run's step_seconds after its first two
steps (rank 0's progress file). Memory: the largest resident set of any process of the run (its trainers,
read from the kernel's accounting of waited-for children).

Accuracy: the demo model (examples/tiny_gpt.py:build, B = 16, m = 2), 50 steps: float32 normal 1x1 and
2x2, float32 exact 1x1 and 2x2, bf16 exact 1x1, each against a float64 normal 1x1 run (max relative
error over every parameter and optimizer-state tensor), and exact 2x2 against exact 1x1 bitwise.

Run: ``python -m bench.exact_bench [--quick]`` (about 15 minutes on 2 cores; --quick: the 4M model only,
fewer steps). Writes the "Exact mode" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, publish, spotmorph

HEADING = "## Exact mode: cost and accuracy (`bench/exact_bench.py`)"
MEASURE = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def train(work: Path, name: str, entry: str, stages: int, replicas: int, steps: int, *extra: str) -> dict[str, float]:
    """One run; its median step seconds (after two) and peak RSS in MiB."""
    run_dir = work / f"run-{name}"
    args = spotmorph(
        "train", entry, f"--stages={stages}", f"--replicas={replicas}", f"--steps={steps}",
        f"--checkpoint-dir={work / name}", f"--run-dir={run_dir}", "--checkpoint-interval=0", "--log-every=100",
        "--device=cpu", *extra,
    )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", MEASURE, *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    from worker_agent.contract import StepCompleted, events_of, read_progress

    steps_done = events_of(read_progress(run_dir / "progress-rank-0.jsonl"), StepCompleted)
    seconds = [e.step_seconds for e in steps_done][2:]
    return {"step": statistics.median(seconds), "rss_mib": int(out.stdout.strip().splitlines()[-1]) / 1024}


def cost(work: Path, sizes: list[str], steps: int) -> list[str]:
    rows = []
    for size in sizes:
        entry = f"{ROOT}/bench/gpt2_sizes.py:build_{size}"
        common = ("--global-batch=16", "--micro-batch-size=4", "--dtype=float32")
        for stages in (1, 2):
            normal = train(work, f"{size}-{stages}-normal", entry, stages, 1, steps, *common)
            exact = train(work, f"{size}-{stages}-exact", entry, stages, 1, steps, *common, "--exact")
            rows.append(
                f"| GPT-2 {size.upper()} | {stages}x1 | {normal['step']:.3f} | {exact['step']:.3f} | "
                f"{exact['step'] / normal['step']:.2f} | {normal['rss_mib']:.0f} | {exact['rss_mib']:.0f} | "
                f"{exact['rss_mib'] / normal['rss_mib']:.2f} |"
            )
            print(rows[-1], flush=True)
    return rows


def accuracy(work: Path, steps: int) -> list[str]:
    from worker_agent.runtime.storage import checkpoint as ck

    entry = f"{ROOT}/examples/tiny_gpt.py:build"
    common = ("--global-batch=16", "--micro-batch-size=2", "--seed=3")
    runs: dict[str, tuple[int, int, tuple[str, ...]]] = {
        "float64 normal 1x1": (1, 1, ("--dtype=float64",)),
        "float32 normal 1x1": (1, 1, ("--dtype=float32",)),
        "float32 normal 2x2": (2, 2, ("--dtype=float32",)),
        "float32 exact 1x1": (1, 1, ("--dtype=float32", "--exact")),
        "float32 exact 2x2": (2, 2, ("--dtype=float32", "--exact")),
        "bf16 exact 1x1": (1, 1, ("--dtype=float32", "--precision=bf16", "--exact")),
    }
    for name, (stages, replicas, extra) in runs.items():
        train(work, name.replace(" ", "-"), entry, stages, replicas, steps, *common, *extra)
    checkpoint = {name: ck.resolve(work / name.replace(" ", "-")) for name in runs}
    reference = checkpoint["float64 normal 1x1"]
    rows = []
    for name in list(runs)[1:]:
        result = ck.diff(reference, checkpoint[name])
        rows.append(f"| {name} | {result['max_rel']:.2e} | {result['worst']} |")
    same = ck.diff(checkpoint["float32 exact 1x1"], checkpoint["float32 exact 2x2"])
    normal = ck.diff(checkpoint["float32 normal 1x1"], checkpoint["float32 normal 2x2"])
    rows.append(
        f"\nExact 2x2 against exact 1x1: {len(same['not_bitwise'])} of {same['tensors_compared']} tensors differ in "
        f"any bit; normal 2x2 against normal 1x1: {len(normal['not_bitwise'])} differ "
        f"(max_rel {normal['max_rel']:.1e})."
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes, steps, accuracy_steps = (["4m"], 6, 10) if args.quick else (["4m", "43m"], 10, 50)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        cost_rows = cost(work, sizes, steps)
        accuracy_rows = accuracy(work, accuracy_steps)
    section = "\n".join(
        [
            HEADING,
            "",
            f"{machine()}. Normal and exact runs one after the other in one session (`python -m bench.exact_bench`).",
            "Exact mode sums every micro-batch's gradients as fixed-point limbs (three per value, integers held",
            "in float64), so it costs a conversion per micro-batch and gradient (about a dozen passes over a",
            "float64 copy, against one add in the normal mode), three float64 sums held per parameter (24 bytes:",
            "about 1 GB for the 43M model, what its RSS grows by), and an all-reduce of the limbs (six times the",
            "bytes of a float32 one) where there are replicas. Accuracy is float32's: the exact runs are as close",
            "to float64 as the normal ones, and every layout gives the same bits.",
            "",
            f"Cost: HF GPT-2, B = 16, m = 4, float32, {steps} steps, median step after the first two.",
            "",
            "| model | layout | normal step (s) | exact step (s) | exact / normal | normal peak RSS (MiB) | "
            "exact peak RSS (MiB) | exact / normal |",
            "|---|---|---|---|---|---|---|---|",
            *cost_rows,
            "",
            f"Accuracy: the demo model, B = 16, m = 2, seed 3, {accuracy_steps} steps, against a float64 normal 1x1"
            " run (max relative error over every tensor).",
            "",
            "| run | max_rel vs float64 | worst tensor |",
            "|---|---|---|",
            *accuracy_rows,
        ]
    )
    publish(HEADING, section, not args.quick)


if __name__ == "__main__":
    main()
