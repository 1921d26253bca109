"""Jobs and nodes as the scheduler sees them (``scheduler.jobs`` values), built from the controller's records.

One source for what the scheduler is told, whether it decides on-demand capacity
(:mod:`~controller.core.reconcile.on_demand`) or shares spot GPUs among jobs
(:mod:`~controller.core.reconcile.sharing`): each job's throughput curve from its planner, corrected by what it
measured (:mod:`~controller.core.reconcile.learn`) and none below its ``min_gpus``; its work left, deadline and
cap; the nodes it holds (those that keep every stage of its layout first, so a shrink keeps them) and the nodes it
may be given.
"""

from __future__ import annotations

import math

from controller.core.lifecycle import JOB_ACTIVE, JobState, NodeState
from controller.core.model import JobRecord, NodeRecord
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.devices import may_run_on
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.holders import holders_to_keep
from controller.core.reconcile.unreachable import held_out
from controller.core.records import Learning
from morphing.planner import Planner
from scheduler import forecast
from scheduler.jobs import Grant, JobView, Node, OnDemand, throughput_curve
from scheduler.learning import Observation, StepModel, corrected_rates
from scheduler.pools import PoolKind

PRESENT = frozenset({NodeState.JOINING, NodeState.READY, NodeState.ASSIGNED, NodeState.DRAINING})
USABLE = frozenset({NodeState.READY, NodeState.ASSIGNED})


def view(draft: Draft, config: Config, planners: Planners, job: JobRecord) -> JobView | None:
    """The job as the scheduler sees it (None: no planner, so no curve)."""
    planner = planners.get(job.id)
    if not isinstance(planner, Planner):
        return None
    present = [n for n in draft.nodes.values() if n.state in USABLE]
    per_node = max((n.slots for n in present), default=1)
    spot = sum(n.slots for n in present if n.pool is PoolKind.SPOT)
    cap = cap_gpus(job, draft.now, config)
    top = max(1, min(config.curve_max_gpus, spot + cap))
    rates = corrected_rates(throughput_curve(planner, top, per_node), model(job.learning))
    rates = tuple(0.0 if gpus < job.spec.min_gpus else rate for gpus, rate in enumerate(rates))  # fit refuses fewer
    held = tuple(
        Grant(job.id, name, node.pool, node.slots)
        for name in holders_first(job)
        if (node := draft.nodes.get(name)) is not None and node.job == job.id and reliable(node, job.id)
    )
    # Pending: its level less the owned nodes the scheduler is shown (USABLE): one still JOINING is on its way.
    ours = sum(n.slots for n in draft.nodes.values() if n.owner == job.id and n.state in USABLE)
    left = max(0, job.spec.steps - job.step) * job.spec.global_batch
    return JobView(
        name=job.id,
        rates=tuple(max(rates[: i + 1]) for i in range(len(rates))),  # never falling, as the planner's own
        remaining_samples=float(left),
        total_samples=float(job.spec.steps * job.spec.global_batch),
        priority=job.spec.priority,
        submitted_at=min(job.submitted_at, draft.now),  # a job here is submitted, whatever a leader's clock said
        deadline=job.spec.deadline_seconds(),
        on_demand=OnDemand(job.spec.on_demand),
        on_demand_cap_gpus=cap,
        waited_seconds=max(0.0, draft.now - since(job.queued_since, job)) if job.state is JobState.QUEUED else 0.0,
        running_seconds=max(0.0, draft.now - since(job.running_since, job)) if job.state in JOB_ACTIVE else 0.0,
        morph_cost_seconds=config.morph_cost_seconds,
        held=held,
        on_demand_pending=max(0, job.on_demand.gpus - ours),
        eligible_nodes=eligible(draft, job),
    )


def holders_first(job: JobRecord) -> list[str]:
    """The job's nodes, those that hold every stage of its layout between them first: the scheduler keeps a job
    on the nodes it holds in this order, so a job shrunk keeps a copy of each stage and morphs through memory."""
    if job.layout is None:
        return list(job.nodes)
    holders = holders_to_keep(job.layout, list(job.nodes), handed_off=False)
    return [*holders, *(n for n in job.nodes if n not in holders)]


def scheduler_nodes(draft: Draft) -> list[Node]:
    """The nodes shown to the scheduler: those any job can rely on (:func:`reliable`), by name."""
    return [
        Node(n.name, n.pool, n.slots, n.owner)
        for n in sorted(draft.nodes.values(), key=lambda n: n.name)
        if reliable(n)
    ]


def eligible(draft: Draft, job: JobRecord) -> frozenset[str]:
    """The nodes the scheduler may give the job: capacity it can rely on (:func:`reliable`), of a device it can use,
    not held out for it (its exclusions after failures, a growth undone)."""
    return frozenset(
        n.name
        for n in draft.nodes.values()
        if reliable(n, job.id) and may_run_on(job, n) and not held_out(job, n.name, draft.now)
    )


def reliable(node: NodeRecord, job_id: str | None = None) -> bool:
    """Whether the node is capacity a job can rely on: usable (not DRAINING under an eviction notice, not JOINING),
    a spot node not at risk of eviction, an on-demand node that is the job's (``job_id``; any owner's for None)."""
    if node.state not in USABLE:
        return False
    if node.pool is PoolKind.SPOT:
        return node.at_risk is None
    return node.owner is not None and (job_id is None or node.owner == job_id)


def since(stamp: float | None, job: JobRecord) -> float:
    """When the job's wait or run began (``JobRecord.queued_since``, ``running_since``): a row older than them
    counts from its state's start."""
    return job.state_since if stamp is None else stamp


def model(learning: Learning) -> StepModel:
    """The job's step-time correction from the checks its record keeps."""
    return StepModel(tuple(Observation(g, p, m) for g, p, m in learning.observations))


def cap_gpus(job: JobRecord, now: float, config: Config) -> int:
    """The most on-demand GPUs the job may hold: its cap in GPUs, and as many as its cap in dollars pays for
    from now to the deadline (held that long at the configured price)."""
    if job.spec.on_demand != "allowed":
        return 0
    cap = job.spec.on_demand_max_gpus or config.curve_max_gpus
    deadline = job.spec.deadline_seconds()
    dollars = job.spec.on_demand_max_dollars
    if dollars is not None and deadline is not None:
        hours = max(deadline - now, 1.0) / 3600.0
        cap = min(cap, math.floor(dollars / (config.on_demand_gpu_hour_price * hours)))
    return max(0, cap)


def spot_rates(draft: Draft) -> forecast.Rates:
    """The spot pool's eviction and refill rates, from the history the controller keeps (``observe_pools``)."""
    return forecast.rates(draft.pools.get(PoolKind.SPOT, forecast.PoolStats(PoolKind.SPOT)))
