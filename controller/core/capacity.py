"""How much capacity to ask the provider for, and when to ask again: pure, like reconcile.

The controller asks for a level, not an increment: the slots its jobs hold (busy nodes) plus the
``min_gpus`` of every queued job, or the free slots when those are more (while jobs wait, the free
nodes they may be admitted onto are wanted, not scaled in under them). Because the level counts busy
nodes, a provider that keeps its set at the level never scales in a node that runs a job. The
provider turns slots into instances and applies its own floor and ceiling (Azure: ``target_capacity``,
``max_capacity``).

On-demand capacity is a level of its own (``pool``): the on-demand GPUs the scheduler wants jobs to hold
(:mod:`~controller.core.reconcile.on_demand`), plus those of given-back on-demand nodes a job still runs on
(released once it moved off). On-demand nodes count for no spot level.

The runner remembers its last ask per pool; it asks again when the level changes, or after a failed ask once
``retry_seconds`` have passed, never on every tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.core.lifecycle import JOB_LIVE, JobState, NodeState
from controller.core.model import NodeRecord, RequestCapacity, World
from scheduler.pools import PoolKind

HOLDING = frozenset({NodeState.ASSIGNED, NodeState.DRAINING})


def busy_nodes(nodes: Mapping[str, NodeRecord]) -> frozenset[str]:
    """Nodes that run (or are stopping) a job: their VMs must not be deleted."""
    return frozenset(n.name for n in nodes.values() if n.job is not None and n.state in HOLDING)


def wanted_slots(world: World) -> int:
    """Slots held by jobs, plus what queued jobs need to start (at least the free slots while they wait)."""
    spot = {name: n for name, n in world.nodes.items() if n.pool is PoolKind.SPOT}
    held = sum(spot[name].slots for name in busy_nodes(spot))
    queued = sum(job.spec.min_gpus for job in world.jobs.values() if job.state is JobState.QUEUED)
    if not queued:
        return held
    free = sum(n.slots for n in spot.values() if n.state is NodeState.READY and n.job is None)
    return held + max(queued, free)


def wanted_on_demand(world: World) -> int:
    """On-demand GPUs live jobs are to hold, plus given-back on-demand nodes a job still runs on."""
    wanted = sum(job.on_demand.gpus for job in world.jobs.values() if job.state in JOB_LIVE)
    leaving = (n for n in world.nodes.values() if n.pool is PoolKind.ON_DEMAND and n.owner is None)
    return wanted + sum(n.slots for n in leaving if n.job is not None and n.state in HOLDING)


@dataclass(frozen=True)
class CapacityAsk:
    """The level last asked of the provider, when, and whether the provider refused it."""

    slots: int
    at: float
    failed: bool = False


def next_ask(
    world: World, now: float, last: CapacityAsk | None, retry_seconds: float, pool: PoolKind = PoolKind.SPOT
) -> RequestCapacity | None:
    """The request of ``pool`` to make now, or None: the level changed, or the last ask failed long enough ago.

    Before the first ask, a level of 0 is not worth saying (the provider keeps its floor anyway).
    """
    wanted = wanted_slots(world) if pool is PoolKind.SPOT else wanted_on_demand(world)
    if last is None:
        return RequestCapacity(wanted, pool) if wanted else None
    if wanted != last.slots or (last.failed and now - last.at >= retry_seconds):
        return RequestCapacity(wanted, pool)
    return None
