"""``make bench``: run every benchmark and rewrite docs/benchmarks.md (machine, date, each figure)."""

from __future__ import annotations

import datetime
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine

BENCHMARKS = (
    "bench.plan_bench",
    "bench.simulate_bench",
    "bench.scheduler_bench",
    "bench.runtime_bench",
    "bench.checkpoint_io_bench",
    "bench.morph_bench",
    "bench.warm_bench",
    "bench.launch_bench",
    "bench.zygote_bench",
    "bench.controller_bench",
)


def main() -> int:
    sections = []
    for name in BENCHMARKS:
        print(f"running {name} ...", flush=True)
        sections.append(importlib.import_module(name).run())
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n\n".join(
        [
            "# Benchmarks",
            f"Measured {today} on {machine()} by `make bench`. Each figure is a ratio to a baseline "
            "measured in the same run where there is one. These machines are shared and noisy; "
            "tests never assert wall-clock times.",
            *sections,
        ]
    )
    (ROOT / "docs" / "benchmarks.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
