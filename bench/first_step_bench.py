"""A generation's first step against its next ones, per rank: what a pipeline pays once per generation.

``python -m bench.first_step_bench [--size 43m] [--stages 2] [--repeat 3] [--repo PATH ...]`` runs ``spotmorph
train`` of a GPT-2 size from ``bench/gpt2_sizes.py`` (P stages, micro-batches of 2, global batch 2P, 4 steps)
from each checkout given (default: this one; ``git worktree add`` an older commit to compare), the checkouts
interleaved, and prints per rank the first step's seconds, the median of steps 2-4 and the difference: the
first step's extra, which a morph's pause ends with. Every step's time is the trainer's own ``step_seconds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(repo: Path, size: str, stages: int) -> dict[int, list[float]]:
    """Each rank's step seconds, in step order, for one run from ``repo``."""
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        command = [sys.executable, "-m", "spotmorph.cli", "train", f"bench/gpt2_sizes.py:build_{size}"]
        command += [f"--stages={stages}", "--micro-batch-size=2", f"--global-batch={2 * stages}", "--steps=4"]
        command += [f"--checkpoint-dir={work / 'ckpt'}", f"--run-dir={work / 'run'}"]
        subprocess.run(command, cwd=repo, check=True, capture_output=True)
        steps: dict[int, list[float]] = {}
        for path in sorted((work / "run").glob("progress-rank-*.jsonl")):
            rank = int(path.stem.rsplit("-", 1)[1])
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            steps[rank] = [float(r["step_seconds"]) for r in records if r.get("event") == "step"]
        return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.first_step_bench")
    parser.add_argument("--size", default="43m", choices=("4m", "43m", "120m"))
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--repo", type=Path, action="append", help="a checkout to run from (repeatable)")
    args = parser.parse_args(argv)
    repos = args.repo or [REPO]
    found: dict[Path, list[dict[int, list[float]]]] = {repo: [] for repo in repos}
    for _ in range(args.repeat):
        for repo in repos:
            found[repo].append(run(repo, args.size, args.stages))
    print("| checkout | rank | first step s | steps 2-4 s (median) | first step's extra s |")
    print("|---|---:|---:|---:|---:|")
    for repo, runs in found.items():
        for rank in sorted(runs[0]):
            first = statistics.median(r[rank][0] for r in runs)
            rest = statistics.median(s for r in runs for s in r[rank][1:])
            print(f"| {repo.name} | {rank} | {first:.2f} | {rest:.2f} | {first - rest:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
