"""A kill without notice in a 3x1 and a 2x2 layout, with peer snapshots and without, for GPT-2 models of a few sizes.

Real local clusters (``spotmorph local up``, 1 slot a VM), a fresh one per run, float32 GPT-2 models from
:mod:`bench.gpt2_sizes` (4M and 43M parameters), global batch 4, a checkpoint every :data:`INTERVAL` steps, a
job that morphs through memory. The planner reads the model's profile made short of memory (3 x its parameter
bytes a GPU: a pipeline of 2 stages or more) and compute-bound (:func:`spotmorph.local.unplanned.pipeline_profile`),
so it picks 3x1 on three VMs and 2x2 on four. Each layout runs with ``snapshot_interval`` 1 (*on*, widened where
a snapshot costs over 5%) and 0 (*off*), a 3x1 also every step whatever it costs (*every-step*:
``snapshot_interval_adapts`` false); a 2x2 has every stage on two nodes, so it takes no snapshot either way (its
on/off pair shows the noise of two runs). The kill is :data:`AFTER_CHECKPOINT` steps past a checkpoint, of the VM
of the last rank (the last stage).

Measured: the steps lost (``spotmorph status``), where the next generation resumed from (``SalvageEnded.source``),
the seconds from the kill to the first step of the next generation done on every rank, and the step period before
the kill (the median time between consecutive steps' last reports, boundary included: the snapshot's copy is at
the boundary). In the same run: the snapshots' step-time cost (3x1 on over off) and the first step after the kill
over the 2x2's (the 2-replica layout). ``python -m bench.peer_snapshot_bench`` puts the tables in
docs/benchmarks.md; ``--quick`` (4M) only prints.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, publish
from bench.memory_morph_bench import wait_event, wait_generation, write_spec
from bench.memory_morph_report import shape
from bench.morph_measure import Recovery, generation_step, measure, warm_pools_full
from controller.eventlog import facts
from spotmorph.local.harness import LocalCluster, world_size
from spotmorph.local.unplanned import pipeline_profile, placement
from worker_agent.contract import StepCompleted

HEADING = "## Peer snapshots: a kill without notice in 3x1 and 2x2 (`bench/peer_snapshot_bench.py`)"
LAYOUTS = {"3x1": 3, "2x2": 4}  # the layout the planner picks on this many one-slot VMs
# The job's snapshot fields: the default (every step at most, widened where one costs over 5% of the steps), every
# step whatever it costs (snapshot_interval_adapts false), none.
SNAPSHOTS: dict[str, dict[str, object]] = {
    "on": {"snapshot_interval": 1},
    "every-step": {"snapshot_interval": 1, "snapshot_interval_adapts": False},
    "off": {"snapshot_interval": 0},
}
BATCH, INTERVAL, AFTER_CHECKPOINT, MEASURED = 4, 10, 5, 8  # MEASURED: steps at least before the kill, warm
MEMORY_PER_PARAMETER_BYTE = 3  # the profile's GPU memory, in the model's parameter bytes: no 1-stage layout fits
Log = Callable[[str], None]


@dataclass(frozen=True)
class Kill:
    size: str
    layout: str  # asked for
    snapshots: str  # on / off
    layouts: str = ""  # P x D of g -> of g+1
    period: float = 0.0  # median seconds between consecutive steps of g (the last rank's report of each)
    first_step: float = 0.0  # the kill -> the first step of g+1 done on every rank
    steps_lost: int = 0  # the controller's count
    source: str = ""  # SalvageEnded.source (memory, snapshot, checkpoint)
    detect: float = 0.0  # the kill -> the controller has a survivor's CollectiveFailed
    firsts: tuple[float, ...] = ()  # every run's first step, where the row ran more than once


def profile(work: Path, size: str) -> Path:
    base = ROOT / "bench" / "profiles" / f"gpt2_{size}.json"
    parameter_bytes = sum(int(layer["parameter_bytes"]) for layer in json.loads(base.read_text())["layers"])
    return pipeline_profile(work / "profile.json", MEMORY_PER_PARAMETER_BYTE * parameter_bytes, base)


def step_period(cluster: LocalCluster, job: str, generation: int, after: float) -> float:
    """The median seconds between consecutive steps completed after ``after``, each at its last rank's report."""
    done: dict[int, float] = {}
    for records in cluster.progress(job, generation).values():
        for x in records:
            if isinstance(x.event, StepCompleted) and x.time > after:
                done[x.event.step] = max(done.get(x.event.step, 0.0), x.time)
    steps = sorted(done)
    gaps = [done[b] - done[a] for a, b in itertools.pairwise(steps) if b == a + 1]
    return statistics.median(gaps) if gaps else float("nan")


def one(work: Path, size: str, layout: str, snap: str, log: Log) -> Kill:
    """A fresh cluster, a job in ``layout`` on it, one VM killed; the run's figures."""
    vms = LAYOUTS[layout]
    work.mkdir(parents=True)
    cluster = LocalCluster(work / "home", poll=0.2)
    try:
        cluster.up(nodes=vms, slots=1, heartbeat_expiry=10.0)
        fields: dict[str, object] = {"name": f"gpt2-{size}-{layout}-{snap}", "profile": str(profile(work, size))}
        fields |= {**SNAPSHOTS[snap], "checkpoint_interval": INTERVAL}
        job = cluster.submit(write_spec(work, size, "memory", BATCH, **fields))
        cluster.wait_status(job, lambda s: s["state"] == "RUNNING" and world_size(s) == vms, 300, "the layout")
        old = int(cluster.status(job)["generation"])
        cluster.wait(lambda: cluster.first_step_done(job, old, vms), 600, "the first step")
        cluster.wait(lambda: warm_pools_full(cluster, 1), 180, "every agent's warm trainer")
        warm = time.time()
        reached = generation_step(cluster, job, old) + MEASURED
        target = -(-reached // INTERVAL) * INTERVAL + AFTER_CHECKPOINT
        cluster.wait(lambda: generation_step(cluster, job, old) >= target, 900, f"step {target}")
        status = cluster.status(job)
        if int(status["generation"]) != old or shape(status) != layout:
            raise RuntimeError(f"{size} {layout} {snap}: the job is not {layout} of generation {old}: {status}")
        r = Recovery("jit", (victim := placement(status)[-1],), old, 0, cluster.kill(victim))
        r.generation = wait_generation(cluster, job, old, vms - 1)
        measure(cluster, job, r)
        ended = wait_event(cluster, job, facts.SalvageEnded, lambda f: f.generation == old, "the salvage").fact
        after = cluster.status(job)
        kill = Kill(
            size,
            layout,
            snap,
            f"{layout} → {shape(after)}",
            step_period(cluster, job, old, warm),
            r.total,
            int(after["steps_lost"]),
            ended.source or ended.reason,
            r.phases().get("detect", float("nan")),
        )
        cluster.cli("cancel", job)
    except Exception:
        log(f"{size} {layout} {snap} failed; the cluster said:\n{cluster.failure_report()}")
        raise
    finally:
        cluster.down()
    log(
        f"{size} {kill.layouts} snapshots {snap}: step period {kill.period:.2f}s, lost {kill.steps_lost} "
        f"(from {kill.source}), first step {kill.first_step:.2f}s after the kill; phases "
        + ", ".join(f"{k} {v:.2f}" for k, v in r.phases().items())
    )
    return kill


def median_kills(kills: Sequence[Kill]) -> list[Kill]:
    """One row per model, layout and snapshots: the run with the median first step (the lower middle one)."""
    out = []
    for key in dict.fromkeys((k.size, k.layout, k.snapshots) for k in kills):
        same = sorted((k for k in kills if (k.size, k.layout, k.snapshots) == key), key=lambda k: k.first_step)
        out.append(
            replace(same[(len(same) - 1) // 2], firsts=tuple(k.first_step for k in same) if len(same) > 1 else ())
        )
    return out


ANCHORS = (
    "| system | what survives a loss | their published figure (theirs, their hardware and models) |",
    "|---|---|---|",
    "| Gemini (SOSP'23) | checkpoints in peers' CPU memory, every iteration, traffic interleaved with training | "
    "failure recovery more than 13x faster than checkpoints to remote storage |",
    "| Oobleck (SOSP'23) | f+1 heterogeneous pipeline templates, state from the surviving replicas | up to 29.6x "
    "the throughput of Bamboo and Varuna under failures |",
    "| Bamboo (NSDI'23) | redundant computation of a neighbour's layers in pipeline bubbles | 3.7x the training "
    "throughput of checkpointing on preemptible instances, 2.4x lower cost than on-demand |",
    "| NVRx (NVIDIA Resiliency Extension) | local checkpoints replicated to other nodes (clique replication), "
    "two parts kept (clean and dirty) | no recovery figure published in its documentation |",
)


def ratios(kills: Sequence[Kill]) -> list[str]:
    """The goals, each against a baseline from the same run."""
    lines = ["", "Same run, against the goals:", ""]
    lines += [
        "| model | 3x1 step period, on / off (goal ≤ 1.05 at 43M) | every-step / off | 2x2 on / off (noise) | 3x1 "
        "first step on / 2x2 first step (goal ≤ 1.5) | every-step / 2x2 | most steps lost, on (goal ≤ 1) | lost, "
        "every-step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in dict.fromkeys(k.size for k in kills):
        row = {(k.layout, k.snapshots): k for k in kills if k.size == size}

        def over(a: tuple[str, str], b: tuple[str, str], attr: str, row: dict[tuple[str, str], Kill] = row) -> str:
            if a not in row or b not in row:
                return "-"
            return f"{getattr(row[a], attr) / getattr(row[b], attr):.3f}"

        lost = max((k.steps_lost for k in row.values() if k.snapshots == "on"), default=-1)
        every = row.get(("3x1", "every-step"))
        lines.append(
            f"| {size.upper()} | {over(('3x1', 'on'), ('3x1', 'off'), 'period')} | "
            f"{over(('3x1', 'every-step'), ('3x1', 'off'), 'period')} | "
            f"{over(('2x2', 'on'), ('2x2', 'off'), 'period')} | {over(('3x1', 'on'), ('2x2', 'on'), 'first_step')} | "
            f"{over(('3x1', 'every-step'), ('2x2', 'on'), 'first_step')} | "
            f"{lost if lost >= 0 else '-'} | {every.steps_lost if every else '-'} |"
        )
    return lines


def section(kills: Sequence[Kill], command: str, load: tuple[float, float], repeat: int) -> str:
    how = (
        f"{repeat} runs of each row, interleaved, each row the run with the median first step"
        if repeat > 1
        else "one run a row"
    )
    lines = [
        HEADING,
        "",
        f"Machine: {machine()}; CPU, gloo; load average {load[0]:.2f} before, {load[1]:.2f} after.",
        f"Command: `{command}`: {how}, each on a fresh local cluster (1 slot a VM); float32, global batch {BATCH}, "
        f"a checkpoint every {INTERVAL} steps, the kill {AFTER_CHECKPOINT} steps past one, of the last stage's VM.",
        "",
        "| model | layout | snapshots | step period s | first step after the kill s | detect s | lost | resumed from |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for k in kills:
        firsts = f" ({', '.join(f'{f:.2f}' for f in k.firsts)})" if k.firsts else ""
        lines.append(
            f"| {k.size.upper()} | {k.layouts} | {k.snapshots} | {k.period:.2f} | {k.first_step:.2f}{firsts} | "
            f"{k.detect:.2f} | {k.steps_lost} | {k.source} |"
        )
    lines += ratios(kills)
    lines += ["", "Beside ours, the anchors' figures, as they published them (not measured here):", "", *ANCHORS]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a kill without notice, with peer snapshots and without")
    parser.add_argument("--sizes", default="4m,43m", help="comma-separated, of 4m, 43m, 120m")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated, of " + ", ".join(LAYOUTS))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each row, interleaved")
    parser.add_argument("--quick", action="store_true", help="the 4M model only; prints, writes no docs")
    args = parser.parse_args(argv)
    sizes = ["4m"] if args.quick else [s.strip() for s in args.sizes.split(",") if s.strip()]
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if unknown := [x for x in layouts if x not in LAYOUTS]:
        parser.error(f"--layouts {','.join(unknown)}: not one of {', '.join(LAYOUTS)}")

    def log(text: str) -> None:
        print(f"  [peer_snapshot_bench] {text}", flush=True)

    load_before = os.getloadavg()[0]
    kills = []
    with tempfile.TemporaryDirectory(prefix="peer-snapshot-bench-") as tmp:
        for n in range(args.repeat):
            for size in sizes:
                for layout in layouts:
                    snaps = [s for s in SNAPSHOTS if layout == "3x1" or s != "every-step"]  # a 2x2 takes none
                    kills += [one(Path(tmp) / f"{size}-{layout}-{s}-{n}", size, layout, s, log) for s in snaps]
    command = "python -m bench.peer_snapshot_bench" + (" --quick" if args.quick else f" --sizes {','.join(sizes)}")
    command += f" --layouts {','.join(layouts)}" if set(layouts) != set(LAYOUTS) else ""
    command += f" --repeat {args.repeat}" if args.repeat > 1 else ""
    text = section(median_kills(kills), command, (load_before, os.getloadavg()[0]), args.repeat)
    publish(HEADING, text, not args.quick and set(layouts) == set(LAYOUTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
