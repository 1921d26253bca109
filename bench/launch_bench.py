"""How long ``spotmorph train`` takes to start its ranks on the CPU: forked from the launcher against a new
interpreter per rank (``--spawn-ranks``, the baseline), in the same run.

A short run of the demo model (``examples/tiny_gpt.py``, 3 steps, so that start-up is most of it) in each
layout, the two ways alternating, ``--repeats`` times: wall seconds of the whole command and CPU seconds of
the launcher and every rank (``RUSAGE_CHILDREN``), medians. ``python bench/launch_bench.py`` prints the section
and updates it in docs/benchmarks.md; ``--quick`` (1x1 and 1x2, once) only prints.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, publish, spotmorph

HEADING = "## Starting the ranks of `spotmorph train` on the CPU (`bench/launch_bench.py`)"
LAYOUTS = ((1, 1), (1, 2), (2, 2))
STEPS = 3


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def one_run(work: Path, stages: int, replicas: int, spawn: bool) -> tuple[float, float]:
    """Wall and CPU seconds of one ``spotmorph train`` command (launcher and ranks)."""
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        command = spotmorph(
            "train",
            "examples/tiny_gpt.py:build",
            f"--stages={stages}",
            f"--replicas={replicas}",
            "--global-batch=16",
            f"--steps={STEPS}",
            f"--checkpoint-dir={tmp}/ckpt",
            *(["--spawn-ranks"] if spawn else []),
        )
        cpu, start = children_cpu(), time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
        return time.perf_counter() - start, children_cpu() - cpu


def measure(layouts: tuple[tuple[int, int], ...], repeats: int) -> list[str]:
    rows = [
        "| layout | ranks | forked wall s | spawned wall s | forked / spawned | forked CPU s | spawned CPU s | "
        "forked / spawned |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        for stages, replicas in layouts:
            runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for _ in range(repeats):
                for spawn in (True, False):
                    runs[spawn].append(one_run(Path(tmp), stages, replicas, spawn))
            wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
            cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
            rows.append(
                f"| {stages}x{replicas} | {stages * replicas} | {wall[False]:.1f} | {wall[True]:.1f} | "
                f"{wall[False] / wall[True]:.2f} | {cpu[False]:.1f} | {cpu[True]:.1f} | {cpu[False] / cpu[True]:.2f} |"
            )
            print(rows[-1], flush=True)
    return rows


def run(repeats: int = 3, quick: bool = False, command: str = "python bench/launch_bench.py") -> str:
    layouts = LAYOUTS[:2] if quick else LAYOUTS
    rows = measure(layouts, 1 if quick else repeats)
    return "\n".join(
        [
            HEADING,
            "",
            f"`{command}` on {machine()}" + (": toy size, not a measurement." if quick else "."),
            "",
            f"`spotmorph train examples/tiny_gpt.py:build`, B = 16, {STEPS} steps (start-up is most of such a run), "
            "each layout run forked (the default on the CPU: the launcher imports torch and the runtime once and "
            "forks every rank) and spawned (`--spawn-ranks`: a new interpreter per rank, as before), alternating, "
            f"{1 if quick else repeats} times; medians of the whole command's wall time and of the CPU time of "
            "the launcher and its ranks.",
            "",
            *rows,
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1x1 and 1x2 once; prints, writes no docs")
    args = parser.parse_args()
    section = run(args.repeats, args.quick)
    publish(HEADING, section, not args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
