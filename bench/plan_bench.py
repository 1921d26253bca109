"""Planner speed: ``spotmorph plan`` for 1,024 GPUs and the 1..1,024 what-if table, end to end.

Baselines measured in the same run: the interpreter start-up floor (``spotmorph --help``) and an
exhaustive planner (every P, m and D simulated, no pruning) on 128 GPUs, against which the shipped
planner's pruned search is compared on the same input.
"""

from __future__ import annotations

import time

from bench.common import ROOT, machine, median, spotmorph, time_command
from morphing.layout import local_nodes
from morphing.planner import Planner, throughput
from morphing.profile import parse_profile

PROFILE = ROOT / "examples" / "profiles" / "gpt48.json"
ARGS = ("--profile", str(PROFILE), "--gpus-per-node", "8", "--global-batch", "512", "--json")


def run() -> str:
    floor = median(time_command(spotmorph("--help"), 5))
    single = time_command(spotmorph("plan", "--gpus", "1024", *ARGS), 5)
    table = time_command(spotmorph("plan", "--gpus", "1-1024", *ARGS), 1)
    profile = parse_profile(PROFILE.read_text())
    start = time.perf_counter()
    pruned = throughput(Planner(profile, 512).plan_gpus(128, 8))
    pruned_s = time.perf_counter() - start
    start = time.perf_counter()
    full = Planner(profile, 512).best_by_exhaustion(local_nodes(128, 8))
    full_s = time.perf_counter() - start
    assert abs(full - pruned) <= 1e-9 * full, (full, pruned)
    return "\n".join(
        [
            "## Planner speed (`bench/plan_bench.py`)",
            "",
            f"GPT-style 48-block profile (`examples/profiles/gpt48.json`), B = 512, 8 GPUs per node. {machine()}.",
            "",
            "| what | seconds | ratio to baseline | goal |",
            "|---|---|---|---|",
            f"| interpreter floor: `spotmorph --help` (median of 5) | {floor:.3f} | 1.00 | |",
            f"| `spotmorph plan --gpus 1024` end to end (median of 5) | {median(single):.3f} | "
            f"{median(single) / floor:.2f}x the floor | < 1 s |",
            f"| `spotmorph plan --gpus 1-1024` what-if table | {table[0]:.3f} | "
            f"{table[0] / floor:.2f}x the floor | < 30 s |",
            f"| exhaustive search, 128 GPUs (baseline) | {full_s:.3f} | 1.00 | |",
            f"| shipped pruned search, 128 GPUs (same optimum) | {pruned_s:.3f} | {full_s / pruned_s:.0f}x faster | |",
            "",
            "Reproduce: `.venv/bin/python -m bench.plan_bench`.",
        ]
    )


if __name__ == "__main__":
    print(run())
