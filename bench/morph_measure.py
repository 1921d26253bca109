"""What the morph benchmark measures: the milestones of one recovery, read from the trainers' progress files
and the controller's event log, and the floor (concurrent torch imports, a gloo process-group set-up).

Every timestamp is unix seconds on this machine (controller, agents and trainers share its clock). A
milestone is the latest over the ranks concerned, so the phases add up to the total.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any

from bench.common import ROOT
from controller.eventlog import facts
from controller.eventlog.schema import logged
from spotmorph.local.harness import LocalCluster, first_event, last_step
from spotmorph.local.processes import alive, free_port, read_pid
from worker_agent.contract import (
    CheckpointLoaded,
    CollectiveFailed,
    StepCompleted,
    TrainerStarted,
    TrainingStopped,
)

# Phases in the order they happen; a recovery has those its path goes through.
PHASES = (
    "stop",  # with notice: notice -> the step boundary the old ranks agreed to stop at (IMDS poll included)
    "checkpoint",  # with notice: the checkpoint written inside the stop
    "detect",  # without notice: kill -> the controller has a survivor's CollectiveFailed report
    "suspect",  # -> NodesSuspected: the nodes not heard from within the grace are taken for lost
    "salvage",  # -> SalvageEnded: the just-in-time checkpoint written and committed, or given up
    "plan",  # -> GenerationIssued (old trainers exited, exit reports, planning)
    "deliver",  # -> the last new trainer process handed the assignment
    "process start",  # -> the last rank ready to rendezvous (python, torch, model built)
    "rendezvous",  # -> the last `started` line (TCPStore + gloo process group)
    "load",  # -> the last `resumed` line (checkpoint verified and loaded)
    "first step",  # -> the last first `step` line of the new generation
)
Milestone = type[facts.CollectiveFailed | facts.NodesSuspected | facts.SalvageEnded | facts.GenerationIssued]
EVENT_MILESTONES: dict[str, Milestone] = {
    "detect": facts.CollectiveFailed,
    "suspect": facts.NodesSuspected,
    "salvage": facts.SalvageEnded,
    "plan": facts.GenerationIssued,
}


@dataclass
class Recovery:
    """One loss (an eviction notice, or VMs killed) and the job's way back to training."""

    path: str  # "notice", "jit", "restart" or "stage"
    nodes: tuple[str, ...]
    old: int  # the generation that lost the nodes
    generation: int  # the one that took over
    start: float  # the notice published, or the first VM killed
    milestones: dict[str, float] = field(default_factory=dict)
    reached: int = 0  # the most steps any rank of the old generation completed (or holds, after a failure)
    resumed: int = 0  # the step the new generation loaded
    back_at: float = 0.0  # the new generation completed step `reached` again (latest over its ranks)
    step_seconds: float = 0.0  # median first step of the new generation
    reason: str = ""  # SalvageEnded's reason (without notice)
    max_rel: float | None = None  # the job's final checkpoint against the uninterrupted reference

    @property
    def total(self) -> float:
        return self.milestones["first step"] - self.start

    @property
    def back(self) -> float:
        return self.back_at - self.start

    @property
    def steps_lost(self) -> int:
        return max(0, self.reached - self.resumed)

    def phases(self) -> dict[str, float]:
        out, previous = {}, self.start
        for name in PHASES:
            if name in self.milestones:
                out[name] = self.milestones[name] - previous
                previous = self.milestones[name]
        return out


def _event_at(events: list[dict[str, Any]], kind: Milestone, generation: int, after: float) -> float | None:
    for e in logged(events, kind):
        if e.fact.generation == generation and e.at >= after:
            return e.at
    return None


def measure(cluster: LocalCluster, job: str, r: Recovery) -> None:
    """Fill ``r``'s milestones and steps from both generations' progress and the event log."""
    m = r.milestones
    old = list(cluster.progress(job, r.old).values())
    if r.path == "notice":
        stopped = [first_event(records, TrainingStopped) for records in old]
        if not all(stopped):
            raise RuntimeError(f"generation {r.old} did not stop cleanly: {stopped}")
        m["stop"] = max(s.stop_at for _, s in filter(None, stopped))
        m["checkpoint"] = max(s.stop_at + s.checkpoint_seconds for _, s in filter(None, stopped))
    events = cluster.events(job)
    for name, kind in EVENT_MILESTONES.items():
        generation = r.generation if kind is facts.GenerationIssued else r.old
        at = _event_at(events, kind, generation, r.start)
        if at is not None and (name == "plan" or r.path != "notice"):
            m[name] = at
    ended = [e.fact for e in logged(events, facts.SalvageEnded) if e.fact.generation == r.old]
    r.reason = ended[0].reason if ended else ""
    new = list(cluster.progress(job, r.generation).values())
    started = [s for records in new if (s := first_event(records, TrainerStarted))]
    resumed = [loaded for records in new if (loaded := first_event(records, CheckpointLoaded))]
    steps = [step for records in new if (step := first_event(records, StepCompleted))]
    m["deliver"] = max(float(s.process_started_at or 0.0) for _, s in started)
    m["process start"] = max(s.ready_at for _, s in started)
    m["rendezvous"] = max(at for at, _ in started)
    m["load"] = max(at for at, _ in resumed)
    m["first step"] = max(at for at, _ in steps)
    r.step_seconds = statistics.median(s.step_seconds for _, s in steps)
    # A rank can hold a step it never reported: its update is done when the per-step all-reduce that
    # precedes the `step` line fails; CollectiveFailed names the step it holds.
    held = [x.event.step for records in old for x in records if isinstance(x.event, CollectiveFailed)]
    r.reached = max([last_step(record for records in old for record in records), *held])
    r.resumed = max(loaded.step for _, loaded in resumed)


def measure_back(cluster: LocalCluster, job: str, r: Recovery) -> None:
    """When the new generation completed the step the old one had reached (after the job ended)."""
    target = max(r.reached, r.resumed + 1)
    times = []
    for records in cluster.progress(job, r.generation).values():
        at = next((x.time for x in records if isinstance(x.event, StepCompleted) and x.event.step >= target), None)
        if at is None:
            raise RuntimeError(f"generation {r.generation} of {job} never completed step {target}")
        times.append(at)
    r.back_at = max(times)


def warm_pools_full(cluster: LocalCluster, slots: int) -> bool:
    """Every live agent has a ready warm trainer per slot (trivially true when they keep none)."""
    if cluster.env.get("SPOTMORPH_WARM_TRAINERS") in ("0", "off"):
        return True
    for vm in cluster.vms():
        if not vm.alive():
            continue
        spools = vm.work_dir.trainers.warm_spools()
        if sum(1 for s in spools if s.ready() and not s.assigned() and alive(read_pid(s.pid_file))) < slots:
            return False
    return True


def generation_step(cluster: LocalCluster, job: str, generation: int) -> int:
    """The most steps a rank of ``generation`` reported (its progress files, read directly)."""
    return last_step(r for records in cluster.progress(job, generation).values() for r in records)


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


def floor(processes: int, repeats: int) -> tuple[float, float]:
    """Median seconds of ``processes`` concurrent torch imports, and of their gloo process-group set-up."""
    imports = statistics.median(concurrent_imports(processes) for _ in range(repeats))
    groups = statistics.median(process_group_setup(processes) for _ in range(repeats))
    return imports, groups
