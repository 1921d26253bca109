"""Trace goodput: `spotmorph simulate` on the shipped AWS p3 trace, every policy against the oracle.

The oracle (best layout at every instant, free morphs) is the baseline of the same run; the goal is
spotmorph at 90% of it or better and ahead of both baselines.
"""

from __future__ import annotations

import json
import subprocess
import time

from bench.common import ROOT, spotmorph

TRACE = ROOT / "examples" / "traces" / "aws-p3-spot.csv"
PROFILE = ROOT / "examples" / "profiles" / "gpt48.json"


def run() -> str:
    rows = []
    for batch in (128, 512):
        start = time.perf_counter()
        out = subprocess.run(
            spotmorph(
                "simulate", "--trace", str(TRACE), "--profile", str(PROFILE), "--global-batch", str(batch), "--json"
            ),
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - start
        report = json.loads(out.stdout)
        for name, row in report["policies"].items():
            rows.append(
                f"| {batch} | {name} | {row['goodput_vs_oracle']:.3f} | {row['steps']:.0f} | {row['morphs']} | "
                f"{row['steps_lost']:.1f} | {row['cost_spot']:.0f} | {row['cost_on_demand_same_samples']:.0f} |"
            )
        rows.append(f"| {batch} | (simulation wall time) | {seconds:.1f} s | | | | | |")
    return "\n".join(
        [
            "## Trace goodput (`bench/simulate_bench.py`)",
            "",
            "`spotmorph simulate` on `examples/traces/aws-p3-spot.csv` (11.4 h of AWS p3 spot availability, up to "
            "32 one-GPU nodes) with the GPT-style 48-block profile; 30 s eviction notices; morph cost 15 s "
            "(the local cluster measures far less, see the morph benchmark); baselines as documented in "
            "`morphing/replay.py`. Goodput is the ratio to the oracle of the same run.",
            "",
            "| B | policy | goodput vs oracle | steps | morphs | steps lost | spot $ | on-demand $ (same samples) |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Reproduce: `.venv/bin/python -m bench.simulate_bench`.",
        ]
    )


if __name__ == "__main__":
    print(run())
