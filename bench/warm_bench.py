"""What a warm trainer costs while it waits: its memory (RSS, PSS) and its CPU use when idle.

A warm trainer (``python -m worker_agent.runtime.process.warm``) is started as the agent's supervisor starts
one, in a spool of its own; once it has written its ready file (torch and the runtime imported), its
``/proc`` figures are read, and its CPU time is measured over an idle window. The baseline is a bare
``python -c 'import time; time.sleep(...)'`` measured the same way in the same run.
``python bench/warm_bench.py`` prints the section and updates it in docs/benchmarks.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, publish
from worker_agent.contract import WarmArguments, WarmSpool

HEADING = "## Warm trainers: what one costs while it waits"
IDLE_SECONDS = float(os.environ.get("WARM_BENCH_IDLE_SECONDS", "10"))


def kib(pid: int, field: str, source: str = "status") -> int:
    for line in Path(f"/proc/{pid}/{source}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/{source}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(process: subprocess.Popen[bytes]) -> tuple[float, float, float]:
    """RSS and PSS (MiB) and the share of one core used over ``IDLE_SECONDS`` of waiting."""
    rss = kib(process.pid, "VmRSS") / 1024
    pss = kib(process.pid, "Pss", "smaps_rollup") / 1024
    before, start = cpu_seconds(process.pid), time.monotonic()
    time.sleep(IDLE_SECONDS)
    used = (cpu_seconds(process.pid) - before) / (time.monotonic() - start)
    return rss, pss, used


def run() -> str:
    with tempfile.TemporaryDirectory(prefix="warm-bench-") as tmp:
        spool = WarmSpool(Path(tmp) / "spool")
        spool.path.mkdir()
        started = time.monotonic()
        warm = subprocess.Popen(WarmArguments(spool.path, os.getpid()).command(sys.executable), cwd=ROOT)
        try:
            while not spool.ready():
                if warm.poll() is not None:
                    raise RuntimeError(f"the warm trainer exited {warm.returncode}")
                time.sleep(0.05)
            ready = time.monotonic() - started
            time.sleep(1.0)  # past the imports' own clean-up
            rss, pss, cpu = measure(warm)
        finally:
            warm.kill()
            warm.wait()
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(1.0)
        bare_rss, bare_pss, bare_cpu = measure(bare)
    finally:
        bare.kill()
        bare.wait()
    rows = [
        "| process | RSS (MiB) | PSS (MiB) | CPU while idle (% of one core) |",
        "|---|---|---|---|",
        f"| warm trainer (torch and the runtime imported, waiting) | {rss:.0f} | {pss:.0f} | {100 * cpu:.2f} |",
        f"| bare Python interpreter (baseline) | {bare_rss:.0f} | {bare_pss:.0f} | {100 * bare_cpu:.2f} |",
    ]
    return "\n".join(
        [
            HEADING,
            "",
            f"{machine()}. Warm trainers are on by default: every agent keeps one per slot "
            "(`spotmorph agent --warm-trainers slots`; `0` or `SPOTMORPH_WARM_TRAINERS=0` turns them off). "
            f"One warm trainer took {ready:.1f} s to become ready (imports on a shared machine); its memory "
            f"and its CPU use over {IDLE_SECONDS:.0f} s of waiting (it polls its spool every 20 ms and checks "
            "that its agent is alive), against a bare interpreter measured the same way:",
            "",
            *rows,
            "",
            "RSS counts shared library pages (libtorch) in full; PSS divides them among the processes that "
            "map them, so N warm trainers on one node cost about N x PSS, not N x RSS. A trainer in use "
            "holds its model, optimizer state and activations on top of this. "
            "Reproduce: `.venv/bin/python bench/warm_bench.py`.",
        ]
    )


def main() -> int:
    section = run()
    publish(HEADING, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
