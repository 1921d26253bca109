"""The scheduler's one entry point: from what is observed now to what to do (``decide``).

The caller (the controller's core, or the multi-job replay) passes the jobs, the nodes present, the spot
pool's forecast rates and ``now``; it gets back which GPUs of which node each job holds (``grants``), which
on-demand capacity to request or give back and why (``capacity``), which running jobs are shrunk and why
(``shrinks``), and why each job holds on-demand GPUs (``on_demand``, for status). Order of the decision: each
job's on-demand need first (``deadlines``), then the spot GPUs shared among the jobs' remaining demand
(``allocation``), then placed on nodes, keeping each job on the nodes it holds (a kept node is no morph).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.allocation import ShareConfig, Shrink, share
from scheduler.deadlines import CapacityCause, DeadlineConfig, OnDemandNeed, on_demand_need
from scheduler.forecast import Rates
from scheduler.jobs import Grant, JobView, Node
from scheduler.outlook import Outlook
from scheduler.outlook import needs as outlook_needs
from scheduler.pools import PoolKind


@dataclass(frozen=True)
class CapacityChange:
    """Ask a provider for ``gpus`` more on-demand GPUs for ``job`` (> 0), or give back ``release_nodes``."""

    job: str
    pool: PoolKind
    gpus: int
    cause: CapacityCause
    release_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    grants: tuple[Grant, ...]
    capacity: tuple[CapacityChange, ...]
    shrinks: tuple[Shrink, ...]
    on_demand: tuple[OnDemandNeed, ...]

    def gpus(self, job: str, pool: PoolKind | None = None) -> int:
        return sum(g.gpus for g in self.grants if g.job == job and (pool is None or g.pool is pool))


@dataclass(frozen=True)
class SchedulerConfig:
    share: ShareConfig = field(default_factory=ShareConfig)
    deadlines: DeadlineConfig = field(default_factory=DeadlineConfig)
    gpus_per_node: int = 1
    # Spot GPUs are shared by what they add on top of each job's on-demand GPUs (two spot GPUs that let a job
    # holding five on-demand ones run at its minimum of seven are worth its whole speed); False: from zero.
    share_counts_on_demand: bool = True


def decide(
    jobs: Sequence[JobView], nodes: Sequence[Node], spot: Rates, now: float, config: SchedulerConfig = SchedulerConfig()
) -> Decision:
    """What to do at ``now``: pure, deterministic for the same input."""
    names = [node.name for node in nodes]
    if len(set(names)) != len(names) or any(node.gpus < 0 for node in nodes):
        raise ValueError("nodes must have distinct names and >= 0 GPUs")
    present = frozenset(names)
    active = [j for j in jobs if j.remaining_samples > 0 and j.submitted_at <= now]
    spot_nodes = [n for n in nodes if n.pool is PoolKind.SPOT]
    spot_gpus = sum(n.gpus for n in spot_nodes)
    held = {j.name: _held(j, present) for j in active}
    # The spot GPUs each job may be given at all (its eligible nodes'): its demand never exceeds them.
    room = {j.name: sum(n.gpus for n in spot_nodes if j.may_use(n.name)) for j in active}
    # What each job would get of spot alone: the share its deadline's forecast starts from.
    alone, _ = share(active, spot_gpus, held, {j.name: min(j.max_gpus, room[j.name]) for j in active}, config.share)
    if config.deadlines.outlook:
        narrow = tuple(sorted((j.name, room[j.name]) for j in active if room[j.name] < spot_gpus))
        outlook = Outlook(spot_gpus, config.gpus_per_node, spot, now, config.deadlines.outlook_step_seconds, narrow)
        owned = {j.name: sum(n.gpus for n in nodes if n.pool is PoolKind.ON_DEMAND and n.owner == j.name) for j in jobs}
        needs = outlook_needs(jobs, alone, outlook, config.deadlines, owned)
    else:
        needs = [
            on_demand_need(j, alone.get(j.name, 0), config.gpus_per_node, spot, now, config.deadlines) for j in jobs
        ]
    capacity, kept = _on_demand_changes(jobs, nodes, needs)
    need = {n.job: n.gpus for n in needs}
    demand = {
        j.name: min(
            room[j.name], max(0, j.max_gpus - max(need[j.name], sum(n.gpus for n in kept if n.owner == j.name)))
        )
        for j in active
    }
    base = {j.name: sum(n.gpus for n in kept if n.owner == j.name) for j in active if config.share_counts_on_demand}
    counts, shrinks = share(active, spot_gpus, held, demand, config.share, base)
    mine = {j.name: j for j in active}
    on_demand = [
        Grant(n.owner, n.name, n.pool, n.gpus) for n in kept if n.owner in mine and mine[n.owner].may_use(n.name)
    ]
    grants = (*on_demand, *place(active, spot_nodes, counts))
    return Decision(grants, capacity, shrinks, tuple(n for n in needs if n.cause is not None))


def _held(job: JobView, present: frozenset[str]) -> int:
    """The spot GPUs the job holds on nodes present that it may still use (what it keeps without a morph)."""
    return sum(g.gpus for g in job.held if g.pool is PoolKind.SPOT and g.node in present and job.may_use(g.node))


def _on_demand_changes(
    jobs: Sequence[JobView], nodes: Sequence[Node], needs: Sequence[OnDemandNeed]
) -> tuple[tuple[CapacityChange, ...], list[Node]]:
    """Requests and releases of on-demand capacity, and the on-demand nodes kept."""
    changes: list[CapacityChange] = []
    kept: list[Node] = []
    wanted = {need.job: need for need in needs}
    pending = {job.name: job.on_demand_pending for job in jobs}
    for owner in sorted({n.owner or "" for n in nodes if n.pool is PoolKind.ON_DEMAND} | set(wanted)):
        owned = sorted((n for n in nodes if n.pool is PoolKind.ON_DEMAND and n.owner == owner), key=lambda n: n.name)
        need = wanted.get(owner, OnDemandNeed(owner, 0, CapacityCause.JOB_DONE))
        surplus = sum(n.gpus for n in owned) + pending.get(owner, 0) - need.gpus
        released = []
        for node in reversed(owned):
            if 0 < node.gpus <= surplus:
                released.append(node.name)
                surplus -= node.gpus
            else:
                kept.append(node)
        cause = need.cause or CapacityCause.JOB_DONE
        if released:
            gone = sum(n.gpus for n in owned if n.name in released)
            changes.append(CapacityChange(owner, PoolKind.ON_DEMAND, -gone, cause, tuple(released)))
        if surplus < 0:
            changes.append(CapacityChange(owner, PoolKind.ON_DEMAND, -surplus, cause))
    return tuple(changes), kept


def place(jobs: Sequence[JobView], nodes: Sequence[Node], counts: dict[str, int]) -> tuple[Grant, ...]:
    """``counts[job]`` GPUs of ``nodes`` for each job: first on the nodes it holds, then on the nodes with the
    most GPUs free (few nodes per job), the jobs that may use fewest nodes first. Never more GPUs of a node than
    it has, never a node the job may not use (``JobView.eligible_nodes``): a count that does not fit its nodes
    is granted in part."""
    free = {node.name: node.gpus for node in nodes}
    pool = {node.name: node.pool for node in nodes}
    grants: list[Grant] = []
    for job in jobs:
        want = counts.get(job.name, 0)
        for held in job.held:
            take = min(want, held.gpus, free.get(held.node, 0))
            if take > 0 and pool[held.node] is held.pool and job.may_use(held.node):
                grants.append(Grant(job.name, held.node, held.pool, take))
                free[held.node] -= take
                want -= take
        counts = {**counts, job.name: want}
    narrowest = sorted(jobs, key=lambda j: len(free) if j.eligible_nodes is None else len(j.eligible_nodes & set(free)))
    for job in narrowest:
        want = counts.get(job.name, 0)
        for name in sorted(free, key=lambda n: (-free[n], n)):
            if want <= 0:
                break
            take = min(want, free[name]) if job.may_use(name) else 0
            if take > 0:
                grants.append(Grant(job.name, name, pool[name], take))
                free[name] -= take
                want -= take
    return _merged(grants)


def _merged(grants: list[Grant]) -> tuple[Grant, ...]:
    total: dict[tuple[str, str, PoolKind], int] = {}
    for g in grants:
        total[(g.job, g.node, g.pool)] = total.get((g.job, g.node, g.pool), 0) + g.gpus
    return tuple(Grant(job, node, kind, gpus) for (job, node, kind), gpus in total.items())
