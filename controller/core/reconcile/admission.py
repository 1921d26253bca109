"""Queued jobs: fail the ones that cannot be planned, admit the rest once arrivals settle, and say what each one
left waits for (:mod:`~controller.core.reconcile.waits`). With several jobs live, on the nodes the scheduler grants
each (:mod:`~controller.core.reconcile.sharing`); a lone job on the free nodes (not at risk of eviction while a
layout fits them)."""

from __future__ import annotations

from collections.abc import Sequence

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import JobState
from controller.core.reconcile.config import Config, Planners, Unplannable
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import fit, start_generation
from controller.core.reconcile.sharing import Scheduled, admit_granted, share_wait
from controller.core.reconcile.waits import Placement, explain_waits
from morphing.planner import Plan
from scheduler.queue import QueueEntry, admission_order


def admit_queued(draft: Draft, config: Config, planners: Planners, scheduled: Scheduled | None = None) -> None:
    for job in [j for j in draft.jobs.values() if j.state is JobState.QUEUED]:
        problem = planners.get(job.id)
        if isinstance(problem, Unplannable):
            draft.move_job(job.id, JobState.FAILED, problem.reason, failure_cause=JobFailureCause.UNPLANNABLE)
    queued = [j for j in draft.jobs.values() if j.state is JobState.QUEUED]
    if not queued:
        return
    placement = Placement(draft, planners)
    settled = draft.arrivals_settled(config.debounce_seconds)
    if scheduled is not None and scheduled.shared:
        waiting = admit_granted(draft, config, planners, scheduled)
        explain_waits(draft, placement, settled, waiting, share_wait(config))
        return
    if settled:  # one job live at most: nothing to share, it takes the free nodes
        free = [(n.name, n.slots) for n in free_nodes(draft.nodes)]
        for entry in admission_order([QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in queued]):
            plan = _placed(draft, planners, entry.job_id, free)
            if plan is None:
                continue
            cause = MorphCause.RESUMED if draft.jobs[entry.job_id].generation else MorphCause.ADMITTED
            start_generation(draft, config, entry.job_id, plan, cause, str(cause))
            free = [n for n in free if n[0] not in plan.layout.nodes()]
    explain_waits(draft, placement, settled, {})


def _placed(draft: Draft, planners: Planners, job_id: str, nodes: Sequence[tuple[str, int]]) -> Plan | None:
    """The best plan on ``nodes``, those at risk of eviction left out while a layout fits the others."""
    clear = [(name, slots) for name, slots in nodes if draft.nodes[name].at_risk is None]
    plan = fit(draft, planners, job_id, clear) if len(clear) < len(nodes) else None
    return plan or fit(draft, planners, job_id, nodes)
