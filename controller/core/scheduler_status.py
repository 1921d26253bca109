"""What status shows of the scheduler's choices for one job: why it holds on-demand capacity, the numbers behind
that, and how far the planner's step-time prediction was off before and after its online correction.

Pure: from the job's record (``JobRecord.on_demand``, ``JobRecord.learning``), the nodes present, ``now`` and the
configured on-demand price. The hold's speeds are those of the decision that set its level (``since``); the
deadline, the work left, the GPUs held and their cost are as of ``now``. Costs are at
``Config.on_demand_gpu_hour_price``: ``cost_dollars`` that of the on-demand nodes the job holds now, from when each
joined; ``spent_dollars`` adds the nodes it gave back, from each one's join to its give-back (a node a job still ran
on when given back costs until it moved off, which is not counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.core.lifecycle import NodeState
from controller.core.records import JobRecord, NodeRecord
from scheduler.deadlines import CapacityCause
from scheduler.pools import PoolKind

HELD = frozenset({NodeState.JOINING, NodeState.READY, NodeState.ASSIGNED, NodeState.DRAINING})


@dataclass(frozen=True)
class OnDemandStatus:
    gpus: int  # the on-demand GPUs the scheduler wants the job to hold
    cause: CapacityCause | None  # why (None: it holds none and was never given any since it last changed)
    since: float | None  # when that level was set
    deadline_in_seconds: float | None  # from now (None: no deadline)
    remaining_samples: float  # now
    spot_gpus: int  # at the decision
    spot_samples_per_second: float  # expected on spot alone (liveput), at the decision
    with_on_demand_samples_per_second: float  # ... with the on-demand level added
    finish_seconds: float | None  # its work left on spot alone at that speed (None: spot alone never finishes)
    held_gpus: int  # on-demand GPUs of the nodes it holds now
    held_nodes: tuple[str, ...]
    cost_dollars: float  # of those nodes since each joined
    gpu_hour_price: float
    spent_dollars: float = 0.0  # all its on-demand capacity: the nodes held now and those it gave back


@dataclass(frozen=True)
class StepTimeStatus:
    """The newest check of the planner's step time against the measured one (``StepTimeChecked``)."""

    generation: int
    checks: int  # observations the correction learned from
    error_before: float | None  # |predicted - measured| / measured, the planner alone
    error_after: float | None  # ... corrected by what the job measured before that check


def on_demand_status(job: JobRecord, nodes: Iterable[NodeRecord], now: float, price: float) -> OnDemandStatus | None:
    """The job's on-demand hold as status shows it; None for a job that may not use on-demand capacity and
    holds none."""
    held = sorted(
        (n for n in nodes if n.owner == job.id and n.pool is PoolKind.ON_DEMAND and n.state in HELD),
        key=lambda n: n.name,
    )
    hold = job.on_demand
    allowed = job.spec.on_demand == "allowed" and job.spec.deadline_seconds() is not None
    if not (allowed or held or hold.gpus or hold.cause is not None):
        return None
    deadline = job.spec.deadline_seconds()
    cost = sum(n.slots * max(0.0, now - n.joined_at) for n in held) * price / 3600.0
    return OnDemandStatus(
        gpus=hold.gpus,
        cause=hold.cause,
        since=hold.since,
        deadline_in_seconds=None if deadline is None else deadline - now,
        remaining_samples=float(max(0, job.spec.steps - job.step) * job.spec.global_batch),
        spot_gpus=hold.spot_gpus,
        spot_samples_per_second=hold.spot_samples_per_second,
        with_on_demand_samples_per_second=hold.with_on_demand_samples_per_second,
        finish_seconds=hold.finish_seconds,
        held_gpus=sum(n.slots for n in held),
        held_nodes=tuple(n.name for n in held),
        cost_dollars=cost,
        gpu_hour_price=price,
        spent_dollars=cost + hold.returned_gpu_seconds * price / 3600.0,
    )


def step_time_status(job: JobRecord) -> StepTimeStatus | None:
    """The newest step-time check (None: none yet)."""
    learned = job.learning
    if learned.checked_generation <= 0:
        return None
    return StepTimeStatus(
        learned.checked_generation, len(learned.observations), learned.error_before, learned.error_after
    )
