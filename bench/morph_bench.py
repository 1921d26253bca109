"""Morph latency on the local cluster: eviction notice -> first completed step in the new layout.

A real local cluster (``spotmorph local up``, 4 nodes x 1 slot: at most 4 trainer processes on this
2-core machine) trains one long float64 demo job. Each round preempts a node the job uses with a
notice (through the local Scheduled Events service, as ``spotmorph local preempt`` does), waits until
the job runs a new generation and every rank of it has completed its first step, then adds a node
(``spotmorph local add 1``) and waits for the job to grow back, so every round starts from the same
cluster. The same job then goes through rounds of ``local kill`` (no notice): a torchrun-style full
restart from the last periodic checkpoint. At the end ``steps_lost`` of the preempt rounds must be 0,
and checkpoints copied along the way must match an uninterrupted 1x1 run (``spotmorph checkpoint
diff``): within 1e-9 while a never-morphed 1x2 run does, and as closely as that control later, when
summation-order rounding has grown in any two layouts (docs/runtime.md).

Timestamps, all unix seconds on this machine (milestone = the latest over the ranks concerned, so
the phases add up to the total):

* notice: when the eviction was published (for a kill: when the VM was killed);
* stop: notice -> the step boundary where the old generation's ranks agreed to stop (``stop_at``
  in their ``stopped`` progress line; includes the agent's IMDS poll and the controller's reply);
* checkpoint: the checkpoint write inside the stop (``checkpoint_seconds`` of ``stopped``);
* plan: old trainers stopped -> the controller's ``GenerationIssued`` event (trainer exit, exit
  report, planning);
* deliver: ``GenerationIssued`` -> the last new trainer process created (``process_started_at``:
  the agents' next heartbeat or event reply);
* process start: -> the last rank ready to rendezvous (``ready_at``: python, torch, model built);
* rendezvous: -> the last ``started`` line (TCPStore + gloo process group);
* load: -> the last ``resumed`` line (checkpoint verified and loaded);
* first step: -> the last first ``step`` line of the new generation.

The floor is measured in the same run: 4 processes importing torch at once, and a 4-process gloo
process-group set-up on loopback. ``python bench/morph_bench.py`` prints the section and updates it
in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, replace_section
from spotmorph.local.harness import (
    LocalCluster,
    first_event,
    last_step,
    max_rel_diff,
    train_reference,
)
from spotmorph.local.processes import alive, free_port, read_pid
from worker_agent.contract import CheckpointLoaded, StepCompleted, TrainerStarted, TrainingStopped

HEADING = "## Morph latency on the local cluster"
NODES, SLOTS = 4, 1
NOTICE = 10.0
BATCH, SEED, INTERVAL = 16, 11, 50
STEPS = 1_000_000  # never reached: the bench cancels the job after comparing a checkpoint
MORPHS = int(os.environ.get("MORPH_BENCH_MORPHS", "10"))
COLD_MORPHS = int(os.environ.get("MORPH_BENCH_COLD_MORPHS", str(MORPHS)))
KILLS = int(os.environ.get("MORPH_BENCH_KILLS", "3"))
# A morphed run may differ from the 1x1 reference by this multiple of what a never-morphed 1x2 run
# does at the same step: both are summation-order rounding, amplified by the same training dynamics.
ROUNDING_FACTOR = 100.0
PHASES = ("stop", "checkpoint", "plan", "deliver", "process start", "rendezvous", "load", "first step")


@dataclass
class Morph:
    cause: str
    node: str
    generation: int  # the new one
    notice: float
    milestones: dict[str, float] = field(default_factory=dict)
    steps_lost: int = 0
    step_seconds: float = 0.0

    @property
    def total(self) -> float:
        return self.milestones["first step"] - self.notice

    def phases(self) -> dict[str, float]:
        out, previous = {}, self.notice
        for name in PHASES:
            if name in self.milestones:
                out[name] = self.milestones[name] - previous
                previous = self.milestones[name]
        return out


def warm_pools_full(cluster: LocalCluster) -> bool:
    """Every live agent has a ready warm trainer per slot (trivially true when they keep none)."""
    if cluster.env.get("SPOTMORPH_WARM_TRAINERS") in ("0", "off"):
        return True
    for vm in cluster.vms():
        if not vm.alive():
            continue
        spools = vm.work_dir.trainers.warm_spools()
        if sum(1 for s in spools if s.ready() and not s.assigned() and alive(read_pid(s.pid_file))) < SLOTS:
            return False
    return True


def measure(cluster: LocalCluster, job: str, morph: Morph, old: int) -> None:
    """Fill ``morph.milestones`` from the old and new generations' progress and the event log."""
    m = morph.milestones
    stopped = [first_event(records, TrainingStopped) for records in cluster.progress(job, old).values()]
    if morph.cause == "preempt":
        if not all(stopped):
            raise RuntimeError(f"generation {old} did not stop cleanly: {stopped}")
        m["stop"] = max(s.stop_at for _, s in filter(None, stopped))
        m["checkpoint"] = max(s.stop_at + s.checkpoint_seconds for _, s in filter(None, stopped))
    issued = [
        e
        for e in cluster.events(job)
        if e["kind"] == "GenerationIssued" and int(e["data"]["generation"]) == morph.generation
    ]
    m["plan"] = float(issued[0]["at"])  # for a kill: detection (a trainer's peer died) and planning
    new = list(cluster.progress(job, morph.generation).values())
    started = [s for records in new if (s := first_event(records, TrainerStarted))]
    resumed = [loaded for records in new if (loaded := first_event(records, CheckpointLoaded))]
    steps = [step for records in new if (step := first_event(records, StepCompleted))]
    m["deliver"] = max(float(s.process_started_at or 0.0) for _, s in started)
    m["process start"] = max(s.ready_at for _, s in started)
    m["rendezvous"] = max(at for at, _ in started)
    m["load"] = max(at for at, _ in resumed)
    m["first step"] = max(at for at, _ in steps)
    morph.step_seconds = statistics.median(s.step_seconds for _, s in steps)


def generation_step(cluster: LocalCluster, job: str, generation: int) -> int:
    return last_step(r for records in cluster.progress(job, generation).values() for r in records)


def resume_step(cluster: LocalCluster, job: str, generation: int) -> int:
    resumed = [first_event(records, CheckpointLoaded) for records in cluster.progress(job, generation).values()]
    return max((r.step for _, r in filter(None, resumed)), default=0)


# -- the floor -------------------------------------------------------------------------------------

PG_SCRIPT = textwrap.dedent(
    """
    import sys, time, json
    from datetime import timedelta
    import torch.distributed as dist
    rank, world, port, go = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    time.sleep(max(0.0, go - time.time()))
    start = time.time()
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    dist.barrier()
    print(json.dumps({"start": start, "end": time.time()}))
    """
)


def concurrent_imports(processes: int) -> float:
    start = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-c", "import torch"], cwd=ROOT) for _ in range(processes)]
    for child in children:
        child.wait()
    return time.perf_counter() - start


def process_group_setup(processes: int) -> float:
    port = free_port()
    go = time.time() + 8.0  # every process has imported torch by then
    children = [
        subprocess.Popen(
            [sys.executable, "-c", PG_SCRIPT, str(r), str(processes), str(port), str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(processes)
    ]
    outs = [json.loads(c.communicate(timeout=120)[0]) for c in children]
    return float(max(o["end"] for o in outs) - min(o["start"] for o in outs))


def floor(processes: int = 4, repeats: int = 3) -> tuple[float, float]:
    imports = statistics.median(concurrent_imports(processes) for _ in range(repeats))
    groups = statistics.median(process_group_setup(processes) for _ in range(repeats))
    return imports, groups


# -- the run ---------------------------------------------------------------------------------------


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass(frozen=True)
class Snapshot:
    """A copy of the job's next periodic checkpoint but one, taken after ``morphs`` morphs."""

    morphs: int
    step: int
    path: Path


def checkpoints_of(cluster: LocalCluster) -> Path:
    return cluster.home.parent / "ckpt"


def snapshot(cluster: LocalCluster, job: str, generation: int) -> Snapshot:
    """Copy the checkpoint two intervals ahead before the job's keep-K rotation removes it."""
    target = (generation_step(cluster, job, generation) // INTERVAL + 2) * INTERVAL
    written = checkpoints_of(cluster) / f"step-{target:08d}"
    cluster.wait(lambda: (written / "manifest.json").exists(), 120, f"checkpoint {target}")
    kept = cluster.home.parent / "compared" / written.name
    if not kept.exists():
        shutil.copytree(written, kept)
    return Snapshot(generation - 1, target, kept)


def rounds(
    cluster: LocalCluster, job: str, cause: str, count: int, log: Callable[[str], None], snaps: list[Snapshot]
) -> list[Morph]:
    morphs = []
    for i in range(count):
        status = cluster.status(job)
        old = int(status["generation"])
        victim = cluster.job_nodes(job)[-1]
        at = cluster.preempt(victim, NOTICE) if cause == "preempt" else cluster.kill(victim)
        generation, _ = cluster.wait_new_generation(job, old, 120)
        morph = Morph(cause, victim, generation, at)
        measure(cluster, job, morph, old)
        if cause == "kill":
            morph.steps_lost = max(0, generation_step(cluster, job, old) - resume_step(cluster, job, generation))
        morphs.append(morph)
        log(
            f"{cause} {i + 1}/{count}: {victim} gen {old}->{generation} {morph.total:.2f}s "
            + " ".join(f"{k}={v:.2f}" for k, v in morph.phases().items())
            + (f" lost={morph.steps_lost}" if cause == "kill" else "")
        )
        cluster.wait(lambda v=victim: cluster.node_state(v) in {"GONE", "LOST"}, 60, f"{victim} gone")  # type: ignore[misc]
        cluster.add(1)
        try:
            cluster.wait_new_generation(job, generation, 180)
        except RuntimeError:
            log("  (the job did not grow back onto the added node)")
        cluster.wait(lambda: warm_pools_full(cluster), 120, "every agent's warm trainers")
        if i % 2 == 1 or i == count - 1:
            snaps.append(snapshot(cluster, job, int(cluster.status(job)["generation"])))
    return morphs


def static_run(work: Path, steps: int, replicas: int) -> Path:
    """An uninterrupted 1 x ``replicas`` run to ``steps``, with a checkpoint every INTERVAL steps kept.

    A job keeps at most 1,000 checkpoints (the job spec's bound): every one up to step 50,000."""
    return train_reference(work, steps, BATCH, SEED, replicas=replicas, checkpoint_interval=INTERVAL, keep=1000)


def run_cluster(work: Path, warm: bool, morphs: int, kills: int, log: Callable[[str], None]) -> dict[str, Any]:
    """One cluster, one job: ``morphs`` evictions with notice, then ``kills`` kills; returns what it saw."""
    cluster = LocalCluster(work / "home", {"SPOTMORPH_WARM_TRAINERS": "1" if warm else "0"}, poll=0.2)
    cluster.up(nodes=NODES, slots=SLOTS)
    try:
        job = cluster.submit(
            steps=STEPS,
            global_batch=BATCH,
            seed=SEED,
            dtype="float64",
            checkpoint_interval=INTERVAL,
            checkpoint_dir=checkpoints_of(cluster),
        )
        first, _ = cluster.wait_new_generation(job, 0, 180)
        cluster.wait(lambda: warm_pools_full(cluster), 120, "every agent's warm trainers")
        log(f"{'warm' if warm else 'cold'}: job {job} running generation {first}")
        snaps: list[Snapshot] = []
        preempts = rounds(cluster, job, "preempt", morphs, log, snaps)
        lost_after_preempts = int(cluster.status(job)["steps_lost"])
        killed = rounds(cluster, job, "kill", kills, log, snaps)
        cluster.cli("cancel", job)
        return {
            "preempts": preempts,
            "kills": killed,
            "lost_after_preempts": lost_after_preempts,
            "snapshots": snaps,
        }
    finally:
        cluster.down()


def _stats(values: Sequence[float]) -> tuple[float, float]:
    return statistics.median(values), max(values)


def table(morphs: list[Morph], floor_total: float, steps_row: bool) -> list[str]:
    rows = [
        "| phase | median (s) | max (s) | median / floor |",
        "|---|---|---|---|",
    ]
    for name in PHASES:
        values = [m.phases()[name] for m in morphs if name in m.phases()]
        if len(values) != len(morphs):
            continue
        label = "detect + plan" if morphs[0].cause == "kill" and name == "plan" else name
        med, top = _stats(values)
        rows.append(f"| {label} | {med:.2f} | {top:.2f} | {med / floor_total:.2f} |")
    med, top = _stats([m.total for m in morphs])
    rows.append(f"| **notice -> first step** | **{med:.2f}** | **{top:.2f}** | **{med / floor_total:.2f}** |")
    if steps_row:
        lost = [float(m.steps_lost) for m in morphs]
        redo = [m.steps_lost * m.step_seconds for m in morphs]
        rows.append(f"| steps lost | {statistics.median(lost):.0f} | {max(lost):.0f} | |")
        rows.append(f"| re-computing lost steps (s) | {statistics.median(redo):.2f} | {max(redo):.2f} | |")
        total = [m.total + m.steps_lost * m.step_seconds for m in morphs]
        med, top = _stats(total)
        rows.append(f"| **kill -> back where it was** | **{med:.2f}** | **{top:.2f}** | **{med / floor_total:.2f}** |")
    return rows


def run() -> str:
    def log(text: str) -> None:
        print(f"  [morph_bench] {text}", flush=True)

    load_before = load_average()
    imports, groups = floor()
    floor_total = imports + groups
    log(f"floor: 4 x import torch {imports:.2f}s, 4-process gloo set-up {groups:.2f}s")
    with tempfile.TemporaryDirectory(prefix="morph-bench-") as tmp:
        work = Path(tmp)
        warm = run_cluster(work / "warm", True, MORPHS, 0, log)
        cold = run_cluster(work / "cold", False, COLD_MORPHS, KILLS, log)
        load_after = load_average()
        snaps = {name: r["snapshots"] for name, r in (("warm", warm), ("cold", cold))}
        last = max(x.step for found in snaps.values() for x in found)
        log(f"uninterrupted 1x1 reference and 1x2 rounding control to step {last}")
        expected = static_run(work, last, 1)
        control = static_run(work, last, 2)
        compared = {
            name: [
                (
                    x,
                    max_rel_diff(expected / x.path.name, x.path),
                    max_rel_diff(expected / x.path.name, control / x.path.name),
                )
                for x in found
            ]
            for name, found in snaps.items()
        }
    for name, result in (("warm", warm), ("cold", cold)):
        assert result["lost_after_preempts"] == 0, f"{name}: a morph with notice lost steps"
        for x, error, rounding in compared[name]:
            bound = max(1e-9, ROUNDING_FACTOR * rounding)
            assert error <= bound, f"{name} step {x.step}: max_rel {error} > {bound} (1x2 control {rounding})"
    kills = cold["kills"]

    def summary(morphs: list[Morph]) -> str:
        med, top = _stats([m.total for m in morphs])
        return f"median **{med:.2f} s**, max {top:.2f} s ({med / floor_total:.2f} x the floor)"

    med_kill = statistics.median(m.total + m.steps_lost * m.step_seconds for m in kills) if kills else 0.0
    return "\n".join(
        [
            HEADING,
            "",
            f"`python bench/morph_bench.py`: a local cluster of {NODES} nodes x {SLOTS} slot, the demo model in "
            f"float64 (B={BATCH}, checkpoint every {INTERVAL} steps). Rounds of: preempt a node "
            f"the job uses with {NOTICE:.0f} s notice (Scheduled Events), wait until every rank of the new "
            "generation completed its first step, `local add 1`, wait for the job to grow back (and for the "
            "agents' warm trainers to be ready again). Once with warm trainers (`SPOTMORPH_WARM_TRAINERS=1`: "
            "the agent keeps a trainer process per slot that has imported torch and waits for an assignment), "
            "once with `SPOTMORPH_WARM_TRAINERS=0` (the default: every trainer a fresh process); the cold "
            f"cluster then goes through {len(kills)} rounds with `local kill` (no "
            "notice): a torchrun-style full restart from the last periodic checkpoint. Milestones are the latest "
            "over the ranks concerned, from the trainers' progress lines and the controller's `GenerationIssued` "
            "event, so the phases add up to the total (`deliver`: until the agents hand the assignment to a "
            "process; `process start`: until it has imported torch and built its stages). "
            f"1-minute load average {load_before:.1f} before and {load_after:.1f} after the run "
            f"({os.cpu_count()} cores, shared with other work).",
            "",
            f"Floor measured in the same run (median of 3): 4 processes importing torch at once "
            f"**{imports:.2f} s**, a 4-process gloo process-group set-up on loopback once they are all "
            f"up **{groups:.2f} s**; a cold restart cannot be faster than their sum, **{floor_total:.2f} s** "
            "(the ratio column).",
            "",
            f"Eviction with notice, warm trainers ({len(warm['preempts'])} morphs): {summary(warm['preempts'])}; "
            f"steps lost {warm['lost_after_preempts']}.",
            "",
            *table(warm["preempts"], floor_total, steps_row=False),
            "",
            f"Eviction with notice, cold trainers ({len(cold['preempts'])} morphs): {summary(cold['preempts'])}; "
            f"steps lost {cold['lost_after_preempts']}.",
            "",
            *table(cold["preempts"], floor_total, steps_row=False),
            "",
            *(
                [
                    f"Full restart after `local kill`, cold ({len(kills)} restarts): {summary(kills)}; time back "
                    f"to the step it had reached (adding the lost steps at the new layout's step time) median "
                    f"{med_kill:.2f} s.",
                    "",
                    *table(kills, floor_total, steps_row=True),
                    "",
                ]
                if kills
                else []
            ),
            "Correctness: after every second round and the last, the job's checkpoint two intervals "
            "ahead is copied and later compared with an uninterrupted 1x1 run of the same steps "
            "(`spotmorph checkpoint diff`, max relative error over every parameter and optimizer-state "
            "tensor), beside a control: an "
            "uninterrupted 1x2 run, never morphed, against the same 1x1 run. Layouts sum gradients in "
            "different orders, so float64 runs differ by rounding, and at the demo model's constant "
            "learning rate that difference grows chaotically after about 1,000 steps (docs/runtime.md). "
            f"The bench fails unless every snapshot is within 1e-9 or within {ROUNDING_FACTOR:.0f}x the "
            "control, whichever is larger; the table shows how closely the morphed job tracks the control.",
            "",
            "| cluster | morphs so far | step | morphed job vs 1x1 | never-morphed 1x2 vs 1x1 |",
            "|---|---|---|---|---|",
            *(
                f"| {name} | {x.morphs} | {x.step} | {error:.1e} | {rounding:.1e} |"
                for name in ("warm", "cold")
                for x, error, rounding in compared[name]
            ),
            "",
            "The end-to-end tests check the 1e-9 bound on jobs of a few hundred steps.",
        ]
    )


def main() -> int:
    section = run()
    print(section)
    replace_section(HEADING, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
