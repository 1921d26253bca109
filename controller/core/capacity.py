"""How much capacity to ask the provider for, and when to ask again: pure, like reconcile.

The controller asks for a level, not an increment: the slots its jobs hold (busy nodes) plus the
``min_gpus`` of every queued job, or the free slots when those are more (while jobs wait, the free
nodes they may be admitted onto are wanted, not scaled in under them). Because the level counts busy
nodes, a provider that keeps its set at the level never scales in a node that runs a job. The
provider turns slots into instances and applies its own floor and ceiling (Azure: ``target_capacity``,
``max_capacity``).

The runner remembers its last ask; it asks again when the level changes, or after a failed ask once
``retry_seconds`` have passed, never on every tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.core.lifecycle import JobState, NodeState
from controller.core.model import NodeRecord, RequestCapacity, World

HOLDING = frozenset({NodeState.ASSIGNED, NodeState.DRAINING})


def busy_nodes(nodes: Mapping[str, NodeRecord]) -> frozenset[str]:
    """Nodes that run (or are stopping) a job: their VMs must not be deleted."""
    return frozenset(n.name for n in nodes.values() if n.job is not None and n.state in HOLDING)


def wanted_slots(world: World) -> int:
    """Slots held by jobs, plus what queued jobs need to start (at least the free slots while they wait)."""
    busy = busy_nodes(world.nodes)
    held = sum(world.nodes[name].slots for name in busy)
    queued = sum(job.spec.min_gpus for job in world.jobs.values() if job.state is JobState.QUEUED)
    if not queued:
        return held
    free = sum(n.slots for n in world.nodes.values() if n.state is NodeState.READY and n.job is None)
    return held + max(queued, free)


@dataclass(frozen=True)
class CapacityAsk:
    """The level last asked of the provider, when, and whether the provider refused it."""

    slots: int
    at: float
    failed: bool = False


def next_ask(world: World, now: float, last: CapacityAsk | None, retry_seconds: float) -> RequestCapacity | None:
    """The request to make now, or None: the level changed, or the last ask failed long enough ago.

    Before the first ask, a level of 0 is not worth saying (the provider keeps its floor anyway).
    """
    wanted = wanted_slots(world)
    if last is None:
        return RequestCapacity(wanted) if wanted else None
    if wanted != last.slots or (last.failed and now - last.at >= retry_seconds):
        return RequestCapacity(wanted)
    return None
