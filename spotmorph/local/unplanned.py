"""Unplanned losses on a local cluster, for the benchmark and the end-to-end tests: which nodes run a
pipeline stage, a profile that makes the planner use a pipeline, killing several VMs at once, and what
the controller's event log says about the salvage (docs/DESIGN.md, "An unplanned loss").
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from controller.eventlog.facts import GenerationIssued, NodesSuspected, SalvageEnded, SalvageOrdered
from controller.eventlog.schema import Logged
from spotmorph.local.cli_calls import ROOT
from spotmorph.local.harness import LocalCluster
from spotmorph.local.provider import kill_vm

DEMO_PROFILE = ROOT / "examples" / "profiles" / "tiny_gpt.json"
# The demo model's six layers do not fit on one VM with this much memory: a pipeline of two or more.
PIPELINE_GPU_MEMORY_BYTES = int(0.0008 * 2**30)
# The facts of an unplanned loss, each naming the generation it is about.
G = TypeVar("G", GenerationIssued, NodesSuspected, SalvageOrdered, SalvageEnded)


def pipeline_profile(path: Path, gpu_memory_bytes: int = PIPELINE_GPU_MEMORY_BYTES, base: Path = DEMO_PROFILE) -> Path:
    """The demo model's profile (or ``base``'s), compute-bound (more VMs always pay) and short of memory (P >= 2).

    On one-slot VMs the planner then picks 2 x 1 on two, 2 x 2 on four and 2 x 3 on six; the model
    trained is the demo model all the same, so its results equal the demo model's reference."""
    profile = json.loads(base.read_text())
    for layer in profile["layers"]:
        for key in ("forward_seconds", "backward_seconds"):
            layer[key] = {size: seconds * 50 for size, seconds in layer[key].items()}
    profile["cluster"].update(
        gpu_memory_bytes=gpu_memory_bytes,
        compute_slots_per_node=1,
        allreduce_bandwidth_bytes_per_second=profile["cluster"]["allreduce_bandwidth_bytes_per_second"] * 10,
    )
    path.write_text(json.dumps(profile))
    return path


def placement(status: Mapping[str, Any]) -> list[str]:
    """The node of every rank of the job's current layout (``status --json``), by rank."""
    return [str(node) for node, _slot in status["layout"]["detail"]["placement"]]


def stage_of(status: Mapping[str, Any], rank: int) -> int:
    """The pipeline stage of ``rank`` (ranks are replica-major: rank = replica * P + stage)."""
    return rank % int(status["layout"]["pipeline_stages"])


def stage_nodes(status: Mapping[str, Any], stage: int) -> list[str]:
    """The nodes that run any rank of ``stage``; killing all of them loses the stage."""
    nodes = placement(status)
    return sorted({nodes[r] for r in range(len(nodes)) if stage_of(status, r) == stage}, key=lambda n: (len(n), n))


def kill_nodes(cluster: LocalCluster, nodes: Sequence[str]) -> float:
    """Kill the VMs of ``nodes`` at once (no notice); returns when they stopped.

    Every victim is frozen (SIGSTOP, its whole session) before any is killed: a frozen process neither
    reports nor closes its sockets, so the cluster sees them all go at the same moment, never one victim
    reacting to the loss of another before its own kill."""
    at = time.time()
    for node in nodes:
        kill_vm(cluster.vm_of(node), signal.SIGSTOP)
    for node in nodes:
        cluster.kill(node)
    return at


def events_of(cluster: LocalCluster, job: str, kind: type[G], generation: int | None = None) -> list[Logged[G]]:
    """The job's events of ``kind`` (of ``generation`` when given: the one their fact names), decoded."""
    return [e for e in cluster.facts(kind, job) if generation is None or e.fact.generation == generation]


def salvage_ended(cluster: LocalCluster, job: str, generation: int) -> SalvageEnded:
    """What the ``SalvageEnded`` event of ``generation``'s loss says (committed, or why it fell back)."""
    found = events_of(cluster, job, SalvageEnded, generation)
    if not found:
        raise RuntimeError(f"job {job}: no SalvageEnded event for generation {generation}")
    return found[0].fact


def issued(cluster: LocalCluster, job: str, generation: int) -> GenerationIssued:
    """What the ``GenerationIssued`` event of ``generation`` says (the checkpoint it resumed from, the held step)."""
    found = events_of(cluster, job, GenerationIssued, generation)
    if not found:
        raise RuntimeError(f"job {job}: no GenerationIssued event for generation {generation}")
    return found[0].fact
