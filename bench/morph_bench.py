"""Morph latency on the local cluster: from a loss (with or without notice) back to training.

Real local clusters (``spotmorph local up``, 4 VMs x 1 slot: at most 4 trainer processes on a small
machine), real kills (``local kill``: SIGKILL of a VM's whole session), float64 demo jobs:

1. **warm cluster** (warm trainers, the default):
   * *notice*: one long job; rounds of: preempt a node it uses with a notice (the local Scheduled Events
     service), wait for the new generation's first step on every rank, ``local add 1``, wait for the job to
     grow back and the agents' warm trainers to be ready again;
   * *jit* (just-in-time checkpoint): per repetition a fresh job of ``STEPS`` steps with a checkpoint
     every ``INTERVAL`` (1 x 4: D = 4), killed without notice ``INTERVAL * k / (REPS + 1)`` steps past a
     periodic checkpoint (the first once the agents' warm trainers are ready again: replacing those the
     job took competes with it); the survivors' held step is salvaged; the job runs to its end and its final
     checkpoint is compared with an uninterrupted 1-process run (``spotmorph checkpoint diff``);
   * *stage*: the same with a profile that makes the planner use a pipeline (2 x 2), killing both VMs of
     its last stage: no survivor holds that stage, the job falls back to its newest periodic checkpoint
     and the event log says so (``SalvageEnded``, reason ``stage_lost``);
2. **cold cluster** (``SPOTMORPH_WARM_TRAINERS=0``) with just-in-time checkpoints disabled (the controller's
   ``salvage_write_seconds`` = 1 ms: every salvage order arrives past its deadline, the writers refuse it and
   the controller falls back): the *jit* kills again, at the same steps: a torchrun-style full restart, every
   trainer a fresh process resuming from the newest periodic checkpoint.

Milestones (:mod:`bench.morph_measure`) come from the trainers' progress lines and the controller's events.
``python -m bench.morph_bench`` prints the section and puts it in docs/benchmarks.md; ``MORPH_BENCH_REPS``
sets the repetitions of each case (3).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, publish
from bench.morph_measure import Recovery, floor, generation_step, measure, measure_back, warm_pools_full
from bench.morph_report import HEADING, Setup, section
from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from spotmorph.local.unplanned import DEMO_PROFILE, kill_nodes, pipeline_profile, placement, stage_nodes

NODES, SLOTS, NOTICE = 4, 1, 10.0
EXPIRY = 8.0  # heartbeat expiry: beyond what detecting a kill takes (the survivors report it in seconds)
BATCH, SEED = 16, 11
STEPS, INTERVAL = 300, 100  # the kills without notice: a checkpoint every 100 steps, killed between 100 and 300
STAGE_STEPS, STAGE_INTERVAL = 100, 20  # a 2 x 2 pipeline steps slower: a shorter job for the stage-lost case
REPS = int(os.environ.get("MORPH_BENCH_REPS", "3"))
FLOOR_REPEATS = int(os.environ.get("MORPH_BENCH_FLOOR_REPEATS", "3"))
COLD = {"SPOTMORPH_WARM_TRAINERS": "0", "SPOTMORPH_CONTROLLER_SALVAGE_WRITE_SECONDS": "0.001"}
Log = Callable[[str], None]


def kill_offsets(interval: int, reps: int) -> list[int]:
    """Where the kills land past the periodic checkpoint: evenly inside the interval (25, 50, 75 of 100)."""
    return [interval * (k + 1) // (reps + 1) for k in range(reps)]


def ready_nodes(cluster: LocalCluster) -> int:
    return sum(1 for n in cluster.nodes() if n["state"] == "READY")


def refill(cluster: LocalCluster, count: int) -> None:
    """Add ``count`` VMs, then wait until NODES are free and every agent's warm trainers are ready."""
    if count:
        cluster.add(count)
    cluster.wait(lambda: ready_nodes(cluster) >= NODES, 120, f"{NODES} free nodes")
    cluster.wait(lambda: warm_pools_full(cluster, SLOTS), 120, "every agent's warm trainers")


def notice_rounds(cluster: LocalCluster, work: Path, log: Log) -> tuple[list[Recovery], int]:
    """Evictions with notice on one long job; the recoveries and the job's steps lost."""
    job = cluster.submit(
        steps=1_000_000,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=50,
        checkpoint_dir=work / "ckpt-notice",
    )
    cluster.wait_new_generation(job, 0, 180)
    cluster.wait(lambda: warm_pools_full(cluster, SLOTS), 120, "every agent's warm trainers")
    out = []
    for i in range(REPS):
        old = int(cluster.status(job)["generation"])
        victim = cluster.job_nodes(job)[-1]
        at = cluster.preempt(victim, NOTICE)
        generation, _ = cluster.wait_new_generation(job, old, 120)
        r = Recovery("notice", (victim,), old, generation, at)
        measure(cluster, job, r)
        out.append(r)
        log(f"notice {i + 1}/{REPS}: {victim} gen {old}->{generation} {r.total:.2f}s")
        cluster.wait(lambda v=victim: cluster.node_state(v) in {"GONE", "LOST"}, 60, f"{victim} gone")  # type: ignore[misc]
        cluster.add(1)
        cluster.wait_new_generation(job, generation, 180)
        cluster.wait(lambda: warm_pools_full(cluster, SLOTS), 120, "every agent's warm trainers")
    lost = int(cluster.status(job)["steps_lost"])
    cluster.cli("cancel", job)
    cluster.wait(lambda: ready_nodes(cluster) >= NODES, 60, "the nodes free again")
    return out, lost


def kill_once(
    cluster: LocalCluster, work: Path, path: str, offset: int, reference: Path, profile: Path, log: Log
) -> Recovery:
    """A fresh job, killed without notice ``offset`` steps past its first periodic checkpoint; runs to its end."""
    steps, interval = (STAGE_STEPS, STAGE_INTERVAL) if path == "stage" else (STEPS, INTERVAL)
    checkpoints = work / f"ckpt-{path}-{offset}"
    job = cluster.submit(
        steps=steps,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=interval,
        checkpoint_dir=checkpoints,
        profile=profile,
    )
    cluster.wait_new_generation(job, 0, 180)
    status = cluster.status(job)  # before the kill: a command takes a while on a loaded machine
    if int(status["generation"]) != 1:
        raise RuntimeError(f"{path}: job {job} morphed before the kill: {status['reason']}")
    layout = status["layout"]
    stages, replicas = int(layout["pipeline_stages"]), int(layout["data_parallel"])
    victims = stage_nodes(status, stages - 1) if path == "stage" else [placement(status)[-1]]
    cluster.wait(lambda: warm_pools_full(cluster, SLOTS), 120, "every agent's warm trainers")
    # Replacing the warm trainers the job took (imports) competes with it: kill only once they are ready.
    now = generation_step(cluster, job, 1)
    target = max(1, (now - offset + interval - 1) // interval) * interval + offset  # the next k * interval + offset
    if target >= steps:
        raise RuntimeError(f"{path}: job {job} was at step {now} when the warm trainers were ready: too late")
    cluster.wait(lambda: generation_step(cluster, job, 1) >= target, 300, f"step {target}")
    at = kill_nodes(cluster, victims)
    generation, _ = cluster.wait_new_generation(job, 1, 180)
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 600)
    if final["state"] != "SUCCEEDED":
        raise RuntimeError(f"{path}: job {job} {final['state']}: {final.get('reason')}\n{cluster.failure_report()}")
    r = Recovery(path, tuple(victims), 1, generation, at)
    measure(cluster, job, r)
    measure_back(cluster, job, r)
    r.max_rel = max_rel_diff(reference, checkpoints)
    log(
        f"{path} +{offset}: {stages}x{replicas} killed {victims} reached {r.reached} resumed {r.resumed} "
        f"({r.reason}) first step {r.total:.2f}s back {r.back:.2f}s max_rel {r.max_rel:.1e}"
    )
    # A killed VM stays READY for the controller until its heartbeat expiry (the salvage only kept it out of
    # this job's next generation): wait for that, or the next job could be placed on it.
    for victim in victims:
        cluster.wait(lambda v=victim: cluster.node_state(v) in {"GONE", "LOST"}, 60, f"{victim} lost")  # type: ignore[misc]
    refill(cluster, len(victims))
    return r


def run_cluster(
    work: Path, env: dict[str, str], cases: Sequence[tuple[str, Path, Path]], notices: bool, log: Log
) -> dict[str, Any]:
    """One cluster: the eviction rounds (``notices``), then per case (path, profile, reference) REPS kills."""
    cluster = LocalCluster(work / "home", env, poll=0.1)
    cluster.up(nodes=NODES, slots=SLOTS, heartbeat_expiry=EXPIRY)
    out: dict[str, Any] = {}
    try:
        refill(cluster, 0)
        if notices:
            out["notice"], out["notice_lost"] = notice_rounds(cluster, work, log)
        for path, profile, reference in cases:
            interval = STAGE_INTERVAL if path == "stage" else INTERVAL
            out[path] = [
                kill_once(cluster, work, path, k, reference, profile, log) for k in kill_offsets(interval, REPS)
            ]
    finally:
        cluster.down()
    return out


def run() -> str:
    def log(text: str) -> None:
        print(f"  [morph_bench] {text}", flush=True)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="morph-bench-") as tmp:
        work = Path(tmp)
        reference = train_reference(work, STEPS, BATCH, SEED)
        stage_reference = train_reference(work, STAGE_STEPS, BATCH, SEED)
        pipeline = pipeline_profile(work / "pipeline_profile.json")
        cases = [("jit", DEMO_PROFILE, reference), ("stage", pipeline, stage_reference)]
        warm = run_cluster(work / "warm", {}, cases, True, log)
        imports, groups = floor(NODES, FLOOR_REPEATS)  # right before the cold restarts, under the same load
        log(f"floor: {NODES} x import torch {imports:.2f}s, {NODES}-process gloo set-up {groups:.2f}s")
        cold = run_cluster(work / "cold", COLD, [("restart", DEMO_PROFILE, reference)], False, log)
    setup = Setup(
        machine=machine(),
        load=(load_before, os.getloadavg()[0]),
        floor=(imports, groups),
        floor_repeats=FLOOR_REPEATS,
        reps=REPS,
        nodes=NODES,
        notice=NOTICE,
        expiry=EXPIRY,
        steps=(STEPS, INTERVAL),
        stage_steps=(STAGE_STEPS, STAGE_INTERVAL),
        kill_offsets=tuple(kill_offsets(INTERVAL, REPS)),
        stage_kill_offsets=tuple(kill_offsets(STAGE_INTERVAL, REPS)),
        batch=BATCH,
    )
    result = section(setup, warm["notice"], warm["notice_lost"], warm["jit"], warm["stage"], cold["restart"])
    check(warm, cold)
    return result


def check(warm: dict[str, Any], cold: dict[str, Any]) -> None:
    """What must hold whatever the timings: no step lost with notice, at most one without it (D >= 2),
    the stage case falls back and says so, and every job ends where the uninterrupted run ends."""
    assert warm["notice_lost"] == 0, f"evictions with notice lost {warm['notice_lost']} steps"
    for r in warm["jit"]:
        assert r.reason == "committed" and r.steps_lost <= 1, (r.reason, r.steps_lost)
    for r in warm["stage"]:
        assert r.reason == "stage_lost" and r.resumed % STAGE_INTERVAL == 0, (r.reason, r.resumed)
    for r in cold["restart"]:
        assert r.reason != "committed" and r.resumed % INTERVAL == 0, (r.reason, r.resumed)
    for r in (*warm["jit"], *warm["stage"], *cold["restart"]):
        assert r.max_rel is not None and r.max_rel <= 1e-9, f"{r.path}: final checkpoint max_rel {r.max_rel}"


def main() -> int:
    text = run()
    publish(HEADING, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
