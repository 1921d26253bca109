"""Which nodes a job may be placed on for the device it asks for, and what a job that needs GPUs waits for.

A job with ``device: cuda`` (a job spec field: auto, cuda or cpu; ``auto`` when a spec does not say) is
offered to its planner only nodes that registered at least one GPU; ``auto`` and ``cpu`` jobs run on
any node. When no node qualifies the job stays QUEUED rather than FAILED: GPU VMs register minutes
after they are asked for (the capacity a queued job asks for is what brings them), so a job submitted
before they boot must wait for them, and its reason says so in ``spotmorph status``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.core.lifecycle import NodeState
from controller.core.model import JobRecord, NodeRecord
from morphing.jobspec import JobSpec
from scheduler.pools import PoolKind

NO_GPU_NODE = "needs GPU nodes; none has registered a GPU"
NO_FREE_GPU_NODE = "needs GPU nodes; waiting for free ones to fit it"
PRESENT = frozenset({NodeState.JOINING, NodeState.READY, NodeState.ASSIGNED, NodeState.DRAINING})


def needs_gpus(spec: JobSpec) -> bool:
    """``device: cuda`` (``auto``, also the default of specs stored before the field existed, runs anywhere)."""
    return spec.device == "cuda"


def may_run_on(job: JobRecord, node: NodeRecord) -> bool:
    """Of a device the job can use, and spot or asked for this job (an on-demand node serves its owner only)."""
    ours = node.pool is PoolKind.SPOT or node.owner == job.id
    return ours and (bool(node.gpus) or not needs_gpus(job.spec))


def waiting_reason(job: JobRecord, nodes: Mapping[str, NodeRecord]) -> str | None:
    """Why a queued job that needs GPUs is still queued; None for a job that runs anywhere."""
    if not needs_gpus(job.spec):
        return None
    if not any(n.gpus and n.state in PRESENT for n in nodes.values()):
        return NO_GPU_NODE
    return NO_FREE_GPU_NODE


def spec_for_generation(job: JobRecord, nodes: Mapping[str, NodeRecord]) -> JobSpec:
    """The spec a generation's trainers get: ``device: auto`` resolved once for all of its ranks.

    Each trainer would otherwise pick CUDA where its node has a GPU and the CPU where not, and ranks of
    one generation on both kinds of node would build NCCL and gloo groups with each other and hang.
    """
    if job.layout is None:
        return job.spec
    return spec_on(job.spec, [nodes.get(name) for name in job.layout.nodes()])


def spec_on(spec: JobSpec, placed: Sequence[NodeRecord | None]) -> JobSpec:
    """``spec`` as its trainers on ``placed`` get it (``device: auto`` resolved for all of them)."""
    if spec.device != "auto":
        return spec
    every_one_has_gpus = all(node is not None and node.gpus for node in placed)
    return spec.model_copy(update={"device": "cuda" if every_one_has_gpus else "cpu"})
