"""The pause of a morph through memory and through the disk, for GPT-2 models of a few sizes.

Real local clusters (``spotmorph local up``, 1 slot a VM), a fresh one per run, float32 GPT-2 models from
:mod:`bench.gpt2_sizes` (4M and 43M parameters; ``--sizes 4m,43m,120m`` adds 120M), global batch 4, a
checkpoint every 1000 steps (so only the morph writes). The planner reads bench/profiles/gpt2_SIZE.json
(``spotmorph profile`` on this machine at low load: one taken under load can make growth not worth it to the
planner). Per model, three morphs, each with ``morph_through_memory`` true (the trainers keep their stage in
memory and hand it over) and false (the stop, or the survivors' just-in-time salvage, writes a checkpoint and
the next generation loads it):

* *growth*: a job on 1 VM, ``local add 1``: it grows to 2 replicas;
* *eviction*: a job on 2 VMs, ``local preempt NODE --notice 20`` on one: it shrinks to 1;
* *kill*: a job on 2 VMs, ``local kill NODE`` on one (no notice): the survivor's collective fails, it shrinks
  to 1;
* ``--cases growth-3-4,eviction-4-3,kill-4-3``: the same from 3 VMs to 4 and from 4 to 3 (the issue's sizes;
  not the default: on 2 cores four trainers share the cores), at a global batch at which the planner wants
  every VM (:data:`WIDE_BATCH`); printed, not written to the docs.

Measured: the pause (``TrainingResumed.pause_seconds``), steps lost, the stop's write on the critical path
(``TrainingStopped.checkpoint_seconds``; after a kill, the salvage's ``SalvageWritten.seconds``), where g+1
resumed from, the pause's phases, and what the morph cost beside g+1's first step (*idle*; *stalled*, the
controller's ``TrainingResumed.stalled_seconds``: :class:`bench.memory_morph_report.Run`). ``--repeat N`` runs
each case N times, interleaved, and shows the run with the median idle; ``--paths`` picks memory, disk or both.
``python -m bench.memory_morph_bench`` puts the tables in docs/benchmarks.md; ``--quick`` (4M, growth) only
prints.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, publish
from bench.gpt2_sizes import SIZES, build_size
from bench.memory_morph_report import (
    CASES,
    DEFAULT_CASES,
    HEADING,
    INTERVAL,
    NEW_STEPS,
    NOTICE,
    PATHS,
    PHASES,
    SEED,
    STEPS_BEFORE,
    Run,
    batch,
    median_runs,
    section,
    shape,
)
from bench.morph_measure import Recovery, generation_step, measure, warm_pools_full
from controller.eventlog import facts
from controller.eventlog.fact import Fact
from controller.eventlog.schema import Logged
from spotmorph.local.harness import LocalCluster, world_size
from spotmorph.local.processes import wait_for
from spotmorph.local.unplanned import issued
from worker_agent.contract import (
    CheckpointLoaded,
    CheckpointSkipped,
    CheckpointWritten,
    CollectiveFailed,
    SalvageWritten,
    StepCompleted,
    TrainingStopped,
)

Log = Callable[[str], None]
F = TypeVar("F", bound=Fact)


def state_bytes(size: str) -> tuple[int, int]:
    """Parameters (the pipeline's: the head's copy of the tied embedding included) and fp32 + AdamW bytes."""
    params = sum(p.numel() for _, layer in build_size(size).layers for p in layer.parameters())
    return params, params * 4 * 3  # weights, exp_avg, exp_avg_sq


def write_spec(work: Path, size: str, path: str, global_batch: int, **fields: object) -> Path:
    """The job's spec (``fields`` added to, or replacing, the bench's own)."""
    spec: dict[str, object] = {
        "name": f"gpt2-{size}-{path}",
        "entrypoint": f"{ROOT}/bench/gpt2_sizes.py:build_{size}",
        "global_batch": global_batch,
        "steps": 1_000_000,
        "seed": SEED,
        "dtype": "float32",
        "checkpoint_interval": INTERVAL,
        "checkpoint_dir": str(work / "ckpt"),
        "profile": str(ROOT / "bench" / "profiles" / f"gpt2_{size}.json"),
        "morph_through_memory": PATHS[path],
        "timeout_seconds": 120.0,  # a 43M+ model's start-up and writes on a loaded 2-core machine
        "peer_timeout_seconds": 60.0,
        **fields,
    }
    (out := work / "job.yaml").write_text(json.dumps(spec))  # JSON is YAML
    return out


def wait_generation(cluster: LocalCluster, job: str, old: int, width: int) -> int:
    """The newest generation past ``old`` whose ``width`` ranks all completed a step, read from the progress
    files: polling the controller would start a Python a poll, on the cores the trainers use."""
    found: list[int] = []

    def stepped() -> bool:
        dirs = (d for vm in cluster.files.vm_dirs() for d in vm.work_dir.trainers.generation_dirs(job))
        newer = sorted({d.generation for d in dirs if d.generation > old}, reverse=True)
        found[:] = [g for g in newer if cluster.first_step_done(job, g, width)][:1]
        return bool(found)

    cluster.wait(stepped, 300, f"the first step of a generation past {old}")
    return found[0]


def wait_event(cluster: LocalCluster, job: str, kind: type[F], match: Callable[[F], bool], what: str) -> Logged[F]:
    """The first event of ``job`` of ``kind`` whose fact ``match``es (the log polled once a second, after the
    measurement)."""
    found: list[Logged[F]] = []

    def seen() -> bool:
        found[:] = [e for e in cluster.facts(kind, job) if match(e.fact)]
        return bool(found)

    wait_for(seen, 300, what, poll=1.0)
    return found[0]


def one(work: Path, size: str, case: str, path: str, log: Log) -> Run:
    """A fresh cluster, a job on it, one planned morph; the run's figures."""
    before, after = CASES[case]
    work.mkdir(parents=True)
    cluster = LocalCluster(work / "home", poll=0.2)
    try:
        cluster.up(nodes=before, slots=1, heartbeat_expiry=10.0 if before + after > 3 else 5.0)  # 4 VMs starve agents
        job = cluster.submit(write_spec(work, size, path, batch(size, case)))
        cluster.wait_status(job, lambda s: s["state"] == "RUNNING" and world_size(s) == before, 300, "the layout")
        old = int(cluster.status(job)["generation"])
        cluster.wait(lambda: cluster.first_step_done(job, old, before), 600, "the first step")
        cluster.wait(lambda: warm_pools_full(cluster, 1), 180, "every agent's warm trainer")
        target = generation_step(cluster, job, old) + STEPS_BEFORE
        cluster.wait(lambda: generation_step(cluster, job, old) >= target, 600, f"step {target}")
        status = cluster.status(job)
        if int(status["generation"]) != old or world_size(status) != before:
            raise RuntimeError(f"{size} {case} {path}: the job morphed before it was asked to: {status}")
        victim = cluster.job_nodes(job)[-1]
        at = time.time()
        kind = case.split("-")[0]
        if kind == "growth":
            cluster.cli("local", "add", "1")
        elif kind == "eviction":
            cluster.cli("local", "preempt", victim, "--notice", str(NOTICE))
        else:
            at = cluster.kill(victim)
        gone = (victim,) if kind != "growth" else ()
        r = Recovery("jit" if kind == "kill" else "notice", gone, old, wait_generation(cluster, job, old, after), at)
        measure(cluster, job, r)  # the phases; "notice": generation g stopped when asked, "jit": its survivors held
        run = read_run(cluster, job, r, Run(size, case, path, layouts=shape(status)))
        cluster.cli("cancel", job)
    except Exception:
        log(f"{size} {case} {path} failed; the cluster said:\n{cluster.failure_report()}")
        raise
    finally:
        cluster.down()
    phases = ", ".join(f"{k} {v:.2f}" for k, v in run.phases.items())
    log(
        f"{size} {case} {path}: pause {run.pause:.2f}s, idle {run.idle:.2f}s, stalled {run.stalled:.2f}s, "
        f"stop write {run.stop_write:.2f}s, from {run.resumed_from}"
    )
    log(f"  lost {run.steps_lost}, phases: {phases}" + "".join(f"\n  NOTE: {n}" for n in run.notes))
    return run


def read_run(cluster: LocalCluster, job: str, r: Recovery, run: Run) -> Run:
    """The figures from the events and both generations' progress; what looks wrong goes in ``run.notes``."""
    run.phases = {k: v for k, v in r.phases().items() if k in PHASES}
    resumed = wait_event(cluster, job, facts.TrainingResumed, lambda f: f.generation == r.generation, "resumed").fact
    run.pause = resumed.pause_seconds
    run.stalled = math.nan if resumed.stalled_seconds is None else resumed.stalled_seconds
    old = [x.event for xs in cluster.progress(job, r.old).values() for x in xs]
    stops = [e for e in old if isinstance(e, TrainingStopped)]
    salvaged = [e.seconds for e in old if isinstance(e, SalvageWritten)]
    run.stop_write = max([s.checkpoint_seconds for s in stops] + salvaged or [0.0])
    stop_step = max([s.step for s in stops] + [e.step for e in old if isinstance(e, CollectiveFailed)])
    steps = [e.step_seconds for e in old if isinstance(e, StepCompleted)]
    run.step_seconds = statistics.median(steps[1:] or steps)
    committed = wait_event(cluster, job, facts.CheckpointCommitted, lambda f: f.step >= stop_step, "the commit")
    run.durable = committed.at - r.milestones.get("stop", r.start)
    run.new_step_seconds = steady_step(cluster, job, r.generation, committed.at)
    new = [x.event for xs in cluster.progress(job, r.generation).values() for x in xs]
    loaded = [e.checkpoint for e in new if isinstance(e, CheckpointLoaded)]
    memory = sum(1 for c in loaded if c.startswith("memory of generation"))
    run.resumed_from = "memory" if memory == len(loaded) else "disk" if memory == 0 else "mixed"
    status = cluster.status(job)
    run.steps_lost, run.layouts = int(status["steps_lost"]), f"{run.layouts} → {shape(status)}"
    held = issued(cluster, job, r.generation).held_step
    if run.resumed_from != run.path:
        run.notes.append(f"g+1 resumed from {', '.join(loaded)}; expected {run.path}")
    if run.path == "memory" and held != stop_step:
        run.notes.append(f"GenerationIssued.held_step {held}, but generation g stopped at step {stop_step}")
    wrote = any(isinstance(e, CheckpointWritten) and e.step == stop_step for e in old)
    if run.path == "memory" and (wrote or salvaged):
        run.notes.append(f"the stop wrote a checkpoint of step {stop_step} on the critical path")
    skipped = sorted({e.message for e in new if isinstance(e, CheckpointSkipped)})
    if run.path == "disk" and skipped:
        run.notes.append(f"GenerationIssued named held_step {held}; g+1's ranks logged: {'; '.join(skipped)}")
    if run.steps_lost or r.steps_lost:
        run.notes.append(f"steps lost: {run.steps_lost} (controller), {r.steps_lost} (progress)")
    return run


def steady_step(cluster: LocalCluster, job: str, generation: int, after: float) -> float:
    """The median step of ``generation`` once nothing runs beside its steps: of the steps completed after
    ``after`` (the morph's checkpoint committed, so the background write is over), the first left out."""

    def steps() -> dict[int, list[float]]:
        records = (x for xs in cluster.progress(job, generation).values() for x in xs if x.time > after)
        out: dict[int, list[float]] = {}
        for x in records:
            if isinstance(x.event, StepCompleted):
                out.setdefault(x.event.step, []).append(x.event.step_seconds)
        return out

    cluster.wait(lambda: len(steps()) > NEW_STEPS, 600, f"{NEW_STEPS + 1} steps of generation {generation}")
    done = steps()
    return statistics.median(s for step in sorted(done)[1:] for s in done[step])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="planned morph pause, through memory and through the disk")
    parser.add_argument("--sizes", default="4m,43m", help="comma-separated, of " + ", ".join(SIZES))
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated, of " + ", ".join(CASES))
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated, of " + ", ".join(PATHS))
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case and path, interleaved")
    parser.add_argument("--quick", action="store_true", help="the 4M model's growth only; prints, writes no docs")
    args = parser.parse_args(argv)
    sizes = ["4m"] if args.quick else [s.strip() for s in args.sizes.split(",") if s.strip()]
    cases = ["growth"] if args.quick else [c.strip() for c in args.cases.split(",") if c.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if unknown := [c for c in cases if c not in CASES]:
        parser.error(f"--cases {','.join(unknown)}: not one of {', '.join(CASES)}")
    if unknown := [p for p in paths if p not in PATHS]:
        parser.error(f"--paths {','.join(unknown)}: not one of {', '.join(PATHS)}")
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give 1 or more runs of each case")
    # printed only: the docs' section holds the default cases, both paths
    partial = args.quick or set(cases) != set(DEFAULT_CASES) or set(paths) != set(PATHS)

    def log(text: str) -> None:
        print(f"  [memory_morph_bench] {text}", flush=True)

    load_before = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory(prefix="memory-morph-bench-") as tmp:
        for n in range(args.repeat):  # interleaved: a slow spell of the machine spreads over every row
            for size in sizes:
                for case in cases:
                    runs += [one(Path(tmp) / f"{size}-{case}-{p}-{n}", size, case, p, log) for p in paths]
    command = "python -m bench.memory_morph_bench" + (" --quick" if args.quick else f" --sizes {','.join(sizes)}")
    if not args.quick and set(cases) != set(DEFAULT_CASES):
        command += f" --cases {','.join(cases)}"
    command += f" --paths {','.join(paths)}" if set(paths) != set(PATHS) else ""
    command += f" --repeat {args.repeat}" if args.repeat > 1 else ""
    sized = {s: state_bytes(s) for s in sizes}
    text = section(median_runs(runs), sized, command, (load_before, os.getloadavg()[0]), args.repeat)
    publish(HEADING, text, not partial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
