"""The pause of a shrink (the scheduler gives one of a job's VMs to a higher-priority job), through memory and through
the disk, for GPT-2 models of a few sizes.

Real local clusters (``spotmorph local up``, 3 VMs of 1 slot), a fresh one per run. The low-priority job is a float32
GPT-2 model of :mod:`bench.gpt2_sizes` planned on a copy of its profile (bench/profiles) made compute-bound and short
of memory (:func:`spotmorph.local.unplanned.pipeline_profile`, :data:`STAGE_MEMORY`): it fits 2 or 3 VMs, never one,
and runs 3 x 1, each VM holding a stage no other holds. Once it has stepped, a priority-5 job (the demo model,
:data:`HIGH_STEPS` steps: the scheduler weighs each job's progress as a fraction of its own work) is submitted; the
scheduler shrinks the first to 2 x 1 and gives the third VM to the second. ``morph_through_memory`` true: the VM
given up leaves at the stop and hands its stage to a VM kept, nothing is written; false: the stop writes the step
and the next generation loads it.

Measured, for the shrunk job's next generation: the pause (``TrainingResumed.pause_seconds``), the stop's write on
the critical path (``TrainingStopped.checkpoint_seconds``), where it resumed from, steps lost. ``python -m
bench.shrink_bench`` puts the table in docs/benchmarks.md; ``--sizes 4m`` only prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, publish
from bench.memory_morph_bench import state_bytes, wait_event
from controller.eventlog import facts
from controller.eventlog.scheduler_facts import JobShrunk
from spotmorph.local.harness import TINY_GPT_SPEC, LocalCluster, world_size
from spotmorph.local.unplanned import pipeline_profile
from worker_agent.contract import CheckpointLoaded, TrainingStopped

HEADING = "## A shrink for a higher-priority job, through memory and through the disk (`bench/shrink_bench.py`)"
PATHS = {"memory": True, "disk": False}
SEED, BATCH, STEPS_BEFORE, HIGH_STEPS = 3, 4, 3, 200
# The planner's samples/s on 1, 2, 3 VMs with this much memory a VM (scheduler.jobs.throughput_curve): 4M 0, 0.69,
# 0.80; 43M 0, 0.089, 0.11. With less, 2 VMs fit nothing and the scheduler has nothing to shrink the job to.
STAGE_MEMORY = {"4m": 60 << 20, "43m": 500 << 20}
WHY = (
    "Through memory the VM given up leaves at the stop and hands the stage only it holds to a VM kept "
    "(`Assignment.leaving`; the kept VMs await it), so nothing is written and the next generation takes the whole "
    "step from memory. Through the disk the stop writes the step and the next generation loads it. Before session "
    "22 a shrink like this one (the kept VMs lacking a stage) did neither alone: the stop wrote the step (*stop "
    "write* as on the disk path) and the next generation read the missing stage from it; not measured."
)


@dataclass
class Run:
    size: str
    path: str
    layouts: str = ""
    pause: float = 0.0
    stop_write: float = 0.0
    resumed_from: str = ""
    steps_lost: int = 0


def spec(work: Path, size: str, path: str) -> Path:
    """The low-priority job: the model's profile made compute-bound and short of memory (3 x 1 on 3 VMs)."""
    base = ROOT / "bench" / "profiles" / f"gpt2_{size}.json"
    profile = pipeline_profile(work / "profile.json", STAGE_MEMORY[size], base)
    fields = {
        "name": f"gpt2-{size}-{path}",
        "entrypoint": f"{ROOT}/bench/gpt2_sizes.py:build_{size}",
        "global_batch": BATCH,
        "steps": 1_000_000,
        "seed": SEED,
        "dtype": "float32",
        "checkpoint_interval": 1000,  # only the shrink writes, if anything
        "checkpoint_dir": str(work / "ckpt"),
        "profile": str(profile),
        "morph_through_memory": PATHS[path],
        "timeout_seconds": 120.0,
        "peer_timeout_seconds": 60.0,
    }
    (out := work / "job.yaml").write_text(json.dumps(fields))  # JSON is YAML
    return out


def one(work: Path, size: str, path: str) -> Run:
    """A fresh cluster, the job on 3 VMs, a priority-5 job submitted; the shrunk job's figures."""
    work.mkdir(parents=True)
    cluster = LocalCluster(work / "home", poll=0.2)
    try:
        cluster.up(nodes=3, slots=1, heartbeat_expiry=10.0)
        low = cluster.submit(spec(work, size, path))
        before = cluster.wait_status(low, lambda s: s["state"] == "RUNNING" and world_size(s) == 3, 300, "3 x 1")
        old = int(before["generation"])
        cluster.wait(lambda: cluster.first_step_done(low, old, 3), 600, "the first step")
        cluster.wait_step(low, int(cluster.status(low)["step"]) + STEPS_BEFORE, 600)
        cluster.submit(TINY_GPT_SPEC, priority=5, steps=HIGH_STEPS, checkpoint_dir=str(work / "high"))
        shrunk = wait_event(cluster, low, JobShrunk, lambda f: True, "the shrink").fact
        new = old + 1
        resumed = wait_event(cluster, low, facts.TrainingResumed, lambda f: f.generation == new, "resumed").fact
        stops = [x.event for xs in cluster.progress(low, old).values() for x in xs]
        loaded = [x.event for xs in cluster.progress(low, new).values() for x in xs]
        sources = {e.checkpoint.startswith("memory") for e in loaded if isinstance(e, CheckpointLoaded)}
        status = cluster.status(low)
        shape = f"{status['layout']['pipeline_stages']}x{status['layout']['data_parallel']}"
        return Run(
            size,
            path,
            f"3x1 → {shape} (gave up {', '.join(shrunk.given_up)})",
            resumed.pause_seconds,
            max([e.checkpoint_seconds for e in stops if isinstance(e, TrainingStopped)] or [0.0]),
            "memory" if sources == {True} else "disk" if sources == {False} else "mixed",
            int(status["steps_lost"]),
        )
    except Exception:
        print(cluster.failure_report())
        raise
    finally:
        cluster.down()


def section(runs: Sequence[Run], command: str) -> str:
    rows = [
        f"| {r.size.upper()} | {state_bytes(r.size)[1] / 1e6:.0f} | {r.layouts} | {r.path} | {r.pause:.2f} | "
        f"{r.stop_write:.2f} | {r.resumed_from} | {r.steps_lost} |"
        for r in runs
    ]
    ratios = []
    for size in dict.fromkeys(r.size for r in runs):
        by = {r.path: r for r in runs if r.size == size}
        if set(by) == set(PATHS) and by["disk"].pause > 0:
            ratios.append(f"{size.upper()} {by['memory'].pause / by['disk'].pause:.2f}")
    return "\n".join(
        [
            HEADING,
            "",
            f"Machine: {machine()}. Command: `{command}`: one run a row, each on a fresh local cluster of 3 "
            "one-slot VMs.",
            "",
            "| model | state MB | shrink | path | pause s | stop write s | resumed from | lost |",
            "|---|---:|---|---|---:|---:|---|---:|",
            *rows,
            "",
            f"Pause through memory / through the disk, same run: {', '.join(ratios) or 'n/a'}.",
            "",
            WHY,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a shrink's pause, through memory and through the disk")
    parser.add_argument("--sizes", default="4m,43m", help="comma-separated, of " + ", ".join(STAGE_MEMORY))
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if unknown := [s for s in sizes if s not in STAGE_MEMORY]:
        parser.error(f"--sizes {','.join(unknown)}: not one of {', '.join(STAGE_MEMORY)}")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="shrink-bench-") as tmp:
        for size in sizes:
            for path in PATHS:
                runs.append(run := one(Path(tmp) / f"{size}-{path}", size, path))
                print(f"  [shrink_bench] {run}", flush=True)
    command = "python -m bench.shrink_bench" + (f" --sizes {args.sizes}" if args.sizes != "4m,43m" else "")
    publish(HEADING, section(runs, command), write=set(sizes) >= {"4m", "43m"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
