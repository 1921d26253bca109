"""Starting a node's warm trainers: forked from the zygote against a new interpreter each, in the same run.

For N warm trainers on one node (the supervisor the agent uses, ``Supervisor(warm=N, zygote=...)``): the wall
time from the first ``prewarm`` until all N are ready, the CPU time every process spent on it (the zygote's
imports included), the PSS of one waiting warm trainer, and the same for N replacements (the N killed,
``prewarm`` again: what a morph that used them costs the node afterwards). Each mode runs in a process of its
own (the zygote makes its supervisor's process a child subreaper), one after the other, medians of
``--repeat``. ``python bench/zygote_bench.py`` prints the section and updates it in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, publish
from bench.warm_bench import cpu_seconds
from morphing.jobspec import JobSpec

HEADING = "## Warm trainers forked from the node's zygote (`bench/zygote_bench.py`)"
MODES = ("zygote", "interpreters")
TAKER = "json:loads"  # the job a morph takes the warm trainers for: any that none of them built ahead


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one(mode: str, count: int, tmp: Path) -> dict[str, float]:
    """One node's supervisor in this process: N warm trainers started, then N replacements."""
    from worker_agent.agent.supervisor import Supervisor

    supervisor = Supervisor(tmp, warm=count, zygote=mode == "zygote")

    def zygote_cpu() -> float:
        zygote = supervisor.warm_trainers._zygote
        return cpu_seconds(zygote.process.pid) if zygote is not None else 0.0

    def until_ready() -> float:
        started = time.monotonic()
        supervisor.prewarm()
        while supervisor.warm_ready() < count:
            if time.monotonic() - started > 300:
                raise RuntimeError(f"{mode}: {supervisor.warm_ready()} of {count} warm trainers ready after 300 s")
            time.sleep(0.02)
        return time.monotonic() - started

    try:
        ready = until_ready()
        time.sleep(0.5)
        waiting = [w.process.pid for w in supervisor.warm_trainers.waiting]
        start_cpu = sum(cpu_seconds(pid) for pid in waiting) + zygote_cpu()
        pss = statistics.median(pss_mib(pid) for pid in waiting)
        job = JobSpec(name="bench", entrypoint=TAKER, global_batch=1, steps=1, checkpoint_dir="/nonexistent")
        for _ in range(count):  # a morph takes them (no warm trainer died unused), and its trainers end
            taken = supervisor.warm_trainers.take("job-bench", job)  # none was told to build ahead: any fits
            assert taken is not None
            os.killpg(taken.process.pid, signal.SIGKILL)
            taken.process.wait()
        zygote_before = zygote_cpu()
        replaced = until_ready()
        time.sleep(0.5)
        waiting = [w.process.pid for w in supervisor.warm_trainers.waiting]
        replace_cpu = sum(cpu_seconds(pid) for pid in waiting) + zygote_cpu() - zygote_before
    finally:
        supervisor.kill_all()
    return {
        "ready": ready,
        "cpu": start_cpu,
        "pss": pss,
        "replace": replaced,
        "replace_cpu": replace_cpu,
    }


def measure(mode: str, count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zygote-bench-") as tmp:
        out = subprocess.run(
            [sys.executable, __file__, "--one", mode, "--count", str(count), "--dir", tmp],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=900,
        )
    if out.returncode != 0:
        raise RuntimeError(f"{mode} x{count} exited {out.returncode}: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.splitlines()[-1]))


def run(counts: tuple[int, ...] = (2, 4), repeat: int = 3) -> str:
    rows = [
        "| warm trainers | start: ready after (s) | start: CPU (s) | replace N: ready after (s) | replace N: CPU (s) "
        "| PSS of one (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for count in counts:
        found: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for _ in range(repeat):
            for mode in MODES:  # interleaved: the machine's noise falls on both
                found[mode].append(measure(mode, count))
        med = {mode: {k: statistics.median(r[k] for r in found[mode]) for k in found[mode][0]} for mode in MODES}
        z, i = med["zygote"], med["interpreters"]
        for mode, m in (("forked from the zygote", z), ("a new interpreter each (baseline)", i)):
            rows.append(
                f"| {count}, {mode} | {m['ready']:.2f} | {m['cpu']:.1f} | {m['replace']:.2f} | "
                f"{m['replace_cpu']:.2f} | {m['pss']:.0f} |"
            )
        rows.append(
            f"| {count}, ratio | **{z['ready'] / i['ready']:.2f}** | **{z['cpu'] / i['cpu']:.2f}** | "
            f"**{z['replace'] / i['replace']:.2f}** | **{z['replace_cpu'] / max(i['replace_cpu'], 1e-9):.2f}** | "
            f"{z['pss'] / i['pss']:.2f} |"
        )
    return "\n".join(
        [
            HEADING,
            "",
            f"{machine()}; medians of {repeat}, the two modes interleaved. On a node without GPUs the agent forks "
            "its warm trainers from one zygote that imported torch, the runtime and "
            "`transformers.modeling_utils` once; the baseline starts a new interpreter per warm trainer, as a GPU "
            "node still does. *Start*: from the first `prewarm` to N ready, and the CPU time of every process "
            "(the zygote's imports included). *Replace N*: the N killed (a morph used them), `prewarm` again.",
            "",
            *rows,
            "",
            "Reproduce: `.venv/bin/python bench/zygote_bench.py`.",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", choices=MODES)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.one:
        result: dict[str, Any] = one(args.one, args.count, args.dir)
        print(json.dumps(result))
        return 0
    section = run(repeat=args.repeat)
    publish(HEADING, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
