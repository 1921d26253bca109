"""Queued jobs: fail the ones that cannot be planned, admit the rest once arrivals settle, and say what each one
left waits for (:mod:`~controller.core.reconcile.waits`). With several jobs live, on the nodes the scheduler grants
each (:mod:`~controller.core.reconcile.sharing`); with one, in queue order on free nodes (not at risk of eviction
while a layout fits them)."""

from __future__ import annotations

from collections.abc import Sequence

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import JobState
from controller.core.reconcile.config import Config, Planners, Unplannable
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import fit, start_generation
from controller.core.reconcile.sharing import Scheduled, admit_granted, share_wait
from controller.core.reconcile.waits import Placement, explain_shared_waits, explain_waits
from morphing.planner import Plan
from scheduler.queue import QueueEntry, admit


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
        explain_shared_waits(draft, placement, settled, waiting, share_wait(config))
        return
    if settled:

        def placed(job_id: str, nodes: Sequence[tuple[str, int]]) -> tuple[Plan, frozenset[str]] | None:
            clear = [(name, slots) for name, slots in nodes if draft.nodes[name].at_risk is None]
            plan = fit(draft, planners, job_id, clear) if len(clear) < len(nodes) else None
            plan = plan or fit(draft, planners, job_id, nodes)  # nodes at risk of eviction only when needed
            return None if plan is None else (plan, frozenset(plan.layout.nodes()))

        entries = [QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in queued]
        free = [(n.name, n.slots) for n in free_nodes(draft.nodes)]
        for job_id, plan in admit(entries, free, placed, placement.fits):
            cause = MorphCause.RESUMED if draft.jobs[job_id].generation else MorphCause.ADMITTED
            start_generation(draft, config, job_id, plan, cause, str(cause))
    explain_waits(draft, placement, settled)
