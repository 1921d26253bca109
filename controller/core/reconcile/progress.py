"""Steps and checkpoints of active jobs, from reports of their current generation only (the fencing rule)."""

from __future__ import annotations

from controller.core.commands import RecordCheckpoint
from controller.core.events import EventKind
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.reports import current_reports


def progress(draft: Draft, job_id: str) -> None:
    job = draft.jobs[job_id]
    step, ckpt = job.step, job.last_checkpoint_step
    for _, report in current_reports(draft, job):
        step, ckpt = max(step, report.last_step), max(ckpt, report.last_checkpoint_step)
    if ckpt > job.last_checkpoint_step:
        draft.issue(RecordCheckpoint(job.id, job.generation, ckpt, draft.now))
        draft.event(EventKind.CHECKPOINT_COMMITTED, job.id, generation=job.generation, step=ckpt)
    if (step, ckpt) != (job.step, job.last_checkpoint_step):
        generation = job.generation if ckpt > job.last_checkpoint_step else job.last_checkpoint_generation
        draft.amend_job(job_id, step=step, last_checkpoint_step=ckpt, last_checkpoint_generation=generation)
