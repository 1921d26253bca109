"""Eviction risk: the cloud's early warning that a VM may be evicted soon, before any notice.

A node at risk (``NodeRecord.at_risk``, recorded by :func:`~controller.core.reconcile.health.note_risk`) gets no
new work: growth never grows a job onto it, admission places a queued job on it only when no layout fits the
other free nodes, and a generation planned after a morph leaves it out when it can do so at no loss of
throughput and no loss of a step held in memory (:func:`clear_of_risk`). A running job on it moves off in a
planned morph (:func:`move_off_risk`: STOP, cause ``EVICTION_RISK``, the protocol of an eviction notice) only
where spare capacity exists: the planner's best layout on the job's other nodes plus free nodes not at risk is
no slower than the current one (:func:`move_pays`). Without spare capacity it stays until a real notice. A job
moves off a risk once (``AtRisk.moved_at``); a risk withdrawn meanwhile cancels nothing started.

At the stop the node at risk is no leaving node (only a notice makes one): its ranks keep their stage in memory
as the others do. So a job moves off it through memory only when the ranks that stay hold every stage
(:func:`memory_whole`); otherwise a step would be lost with the node's memory, and the job waits for the notice,
whose stop hands the node's layers to the ranks that stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from controller.core.causes import MorphCause
from controller.core.model import Action, JobRecord
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import fit, planned
from controller.core.reconcile.growth import growing, measured_rate
from controller.core.reconcile.holders import holders_to_keep
from controller.core.records import AtRisk
from morphing.planner import Plan, Planner

TOLERANCE = 1e-9
"""Two predictions this close (relative) are equal: the same layout on other nodes of the same size."""


def move_pays(current: float | None, candidate: float | None, remaining: float | None, config: Config) -> str | None:
    """Why moving off a node at risk pays (``None``: it does not), by growth's cost model (``morph_cost_seconds``
    over the horizon): staying pays a morph too when the eviction comes, and maybe steps lost besides, so moving
    pays when the layout without the node is no slower and the job runs long enough to pay a morph at all."""
    if candidate is None or current is None:
        return None
    horizon = config.policy.horizon_seconds if remaining is None else min(config.policy.horizon_seconds, remaining)
    if horizon <= config.morph_cost_seconds or candidate < current * (1.0 - TOLERANCE):
        return None
    return f"{candidate:.2f} vs {current:.2f} samples/s on the nodes not at risk"


def memory_whole(job: JobRecord, staying: Sequence[str]) -> bool:
    """Whether a stop leaves every layer of the job in the memory of ``staying`` (or writes the step anyway)."""
    if not job.spec.morph_through_memory or job.layout is None:
        return True
    return bool(holders_to_keep(job.layout, staying, handed_off=False))


def move_off_risk(draft: Draft, config: Config, planners: Planners) -> None:
    """Running jobs on nodes at risk move off them where spare nodes keep their throughput (claimed for this
    pass, so no growth stops for them too)."""
    for job in growing(draft.jobs.values()):
        risky = _risks(draft, job)
        fresh = {name: at for name, at in risky.items() if at.moved_at is None}
        planner = planners.get(job.id)
        if not fresh or not isinstance(planner, Planner) or job.layout is None:
            continue
        staying = [n for n in job.nodes if draft.assigned(job, n) and n not in risky]
        if not memory_whole(job, staying):
            continue
        spare = {n.name: n.slots for n in free_nodes(draft.nodes) if n.at_risk is None and n.name not in draft.claimed}
        candidate = fit(draft, planners, job.id, [(n, draft.nodes[n].slots) for n in staying] + list(spare.items()))
        current = planned(draft, job.id, planner.evaluate, job.layout)
        if job.id in draft.unplannable or candidate is None or not isinstance(current, Plan):
            continue
        rate, _ = measured_rate(job, draft.now, current.samples_per_second)
        remaining = max(0, job.spec.steps - job.step) * job.spec.global_batch / rate if rate else None
        why = move_pays(current.samples_per_second, candidate.samples_per_second, remaining, config)
        if why is None:
            continue
        named = ", ".join(f"{name} ({at.risk.source or 'unnamed source'})" for name, at in fresh.items())
        draft.start_morph(job.id, Action.STOP, MorphCause.EVICTION_RISK, f"eviction risk: {named}; {why}")
        for name, at in fresh.items():
            draft.amend_node(name, at_risk=replace(at, moved_at=draft.now))
        draft.claimed.update(n for n in candidate.layout.nodes() if n in spare)


def _risks(draft: Draft, job: JobRecord) -> dict[str, AtRisk]:
    """The job's nodes at risk that it still runs on, with their risks."""
    found: dict[str, AtRisk] = {}
    for name in job.nodes:
        at = draft.nodes[name].at_risk if draft.assigned(job, name) else None
        if at is not None:
            found[name] = at
    return found


def clear_of_risk(best: Plan, clear: Plan | None, before: float | None) -> Plan:
    """The next generation's plan: ``clear`` (on no node at risk) unless there is none or it is slower than both
    ``best`` (which uses nodes at risk) and the generation before (``before`` samples/s): a job keeps a node at
    risk only while nothing as fast can do without it."""
    if clear is None:
        return best
    bar = best.samples_per_second if before is None else min(best.samples_per_second, before)
    return clear if clear.samples_per_second >= bar * (1.0 - TOLERANCE) else best
