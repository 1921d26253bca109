"""Steps, checkpoints (and how long each paused training), evaluations and the pause a morph caused, from
reports of the current generation only (the fencing rule).

**The pause** is what a user feels of a morph: from the last step the job completed before it (in any
earlier generation) to the first step the new generation completed. Both ends are the trainers' own wall
clocks (``time.time()`` where each step ended), so the pause is right across nodes whose clocks are
NTP-synced, as cloud VMs' are; a skewed clock could make it negative, and it is then reported as 0. The
decision time (the morph's start to the new generation's issue) is the controller's clock, ``draft.now``.
The pause is measured once, in the pass that first sees a step of the new generation; a generation that
never completes a step carries the pause over to the next one. Of the pause, *stalled* is the time no rank
could step: to when the new generation's ranks began their first step (each rank's first step time, its
end less its length); the rest is that step, whose length grows with the model's compute, not with the morph.
"""

from __future__ import annotations

from dataclasses import replace

from controller.core.commands import RecordCheckpoint, RecordPause
from controller.core.model import JobRecord, RankReport, Training
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.reports import current_reports
from controller.core.records import CheckpointRef, CheckpointStall, Evaluation, JobFields
from controller.eventlog import facts


def progress(draft: Draft, job_id: str, progress_event_seconds: float = 60.0) -> None:
    job = draft.jobs[job_id]
    reports = [report for _, report in current_reports(draft, job)]
    step = max([job.step, *(r.last_step for r in reports)])
    ckpt = max([job.last_checkpoint.step, *(r.last_checkpoint_step for r in reports)])
    if ckpt > job.last_checkpoint.step:
        draft.issue(RecordCheckpoint(job.id, job.generation, ckpt, draft.now))
        draft.event(facts.CheckpointCommitted(job.generation, ckpt), job.id)
    fields: JobFields = {}
    last = CheckpointRef(ckpt, job.generation) if ckpt > job.last_checkpoint.step else job.last_checkpoint
    if (step, last) != (job.step, job.last_checkpoint):
        fields.update({"step": step, "last_checkpoint": last})
    fields.update(_evaluation(draft, job, reports))
    fields.update(_training(draft, job, reports, progress_event_seconds))
    fields.update(_stall(draft, job, reports))
    fields.update(_pause(draft, job, reports))
    fields.update(_held_skipped(draft, job, reports))
    if fields:
        draft.amend_job(job_id, **fields)


def _held_skipped(draft: Draft, job: JobRecord, reports: list[RankReport]) -> JobFields:
    """The generation was named a step held in memory and resumed from the committed checkpoint instead (every
    rank decides alike): said once, with the reason, and the steps between the two counted as lost."""
    said = next((r for r in reports if r.held_skipped), None)
    if not job.held.step or said is None:
        return {}
    lost = max(0, job.held.step - job.resume.step)
    cause = said.held_skipped_cause.value if said.held_skipped_cause is not None else None
    draft.event(
        facts.HeldStateSkipped(job.generation, job.held.step, job.resume.step, said.held_skipped, cause), job.id
    )
    step = max([job.resume.step, *(r.last_step for r in reports)])
    return {"held": CheckpointRef(), "steps_lost": job.steps_lost + lost, "step": step}


def _training(draft: Draft, job: JobRecord, reports: list[RankReport], every: float) -> JobFields:
    """The newest step's loss and samples/s any rank reported (every rank reports the global batch's loss), kept
    on the job; an event says it at most every ``every`` seconds, so a long job's log stays readable."""
    newest = max((r for r in reports if r.loss is not None), key=lambda r: r.last_step, default=None)
    seen = job.training
    if newest is None or (seen.generation == job.generation and newest.last_step <= seen.step):
        return {}  # a new generation's first loss replaces the last one even when it resumed from an earlier step
    training = Training(newest.loss, newest.last_step, newest.samples_per_second, seen.reported_at, job.generation)
    if seen.reported_at is None or draft.now - seen.reported_at >= every:
        progressed = facts.TrainingProgressed(job.generation, newest.last_step, newest.loss, newest.samples_per_second)
        draft.event(progressed, job.id)
        training = replace(training, reported_at=draft.now)
    return {"training": training}


def _evaluation(draft: Draft, job: JobRecord, reports: list[RankReport]) -> JobFields:
    """The newest evaluation any rank reported, once (every rank reports the same loss for a step)."""
    newest = max((r for r in reports if r.eval_loss is not None), key=lambda r: r.eval_step, default=None)
    if newest is None or newest.eval_step <= job.evaluation.step:
        return {}
    loss = newest.eval_loss
    assert loss is not None  # chosen among the reports that have one
    draft.event(facts.EvaluationCompleted(job.generation, newest.eval_step, loss), job.id)
    return {"evaluation": Evaluation(newest.eval_step, loss)}


def _stall(draft: Draft, job: JobRecord, reports: list[RankReport]) -> JobFields:
    """How long the newest checkpoint paused training: its slowest rank's stall (the next step's collectives
    wait for every rank). Ranks report at different beats, so a later, longer stall of the same checkpoint
    replaces the one shown; a checkpoint of a newer generation, or at a newer step, replaces it in any case."""
    stalls = [(r.stall_step, r.stall_seconds) for r in reports if r.stall_seconds is not None]
    if not stalls:
        return {}
    step = max(s for s, _ in stalls)
    seconds = max(t for s, t in stalls if s == step)
    shown = job.checkpoint_stall
    known = (shown.generation, shown.step)
    if shown.seconds is not None and (
        (job.generation, step) < known or ((job.generation, step) == known and seconds <= shown.seconds)
    ):
        return {}
    draft.event(facts.CheckpointStallMeasured(job.generation, step, seconds), job.id)
    return {"checkpoint_stall": CheckpointStall(seconds, step, job.generation)}


def _stalled(reports: list[RankReport], since: float, pause: float) -> float | None:
    """Of ``pause``, the time no rank could step: to the last reporting rank's start of its first step (every
    rank starts it within moments of the others: they leave the load together). None when none said."""
    began = [
        r.first_step_at - r.first_step_seconds
        for r in reports
        if r.first_step_at is not None and r.first_step_seconds is not None
    ]
    return min(pause, max(0.0, max(began) - since)) if began else None


def _pause(draft: Draft, job: JobRecord, reports: list[RankReport]) -> JobFields:
    """The newest step's time; and, at the first step of a generation after a morph, the pause it caused."""
    fields: JobFields = {}
    ended = [r.last_step_at for r in reports if r.last_step_at is not None]
    if ended and (job.last_step_at is None or max(ended) > job.last_step_at):
        fields["last_step_at"] = max(ended)
    first = min((r.first_step_at for r in reports if r.first_step_at is not None), default=None)
    since = job.morph.paused_since
    if since is None or first is None:
        return fields
    pause = max(0.0, first - since)  # clocks are NTP-synced; a skewed one is no negative pause
    stalled = _stalled(reports, since, pause)
    draft.issue(RecordPause(job.id, job.generation, pause, stalled))
    step = job.resumed_at_step + 1
    resumed = facts.TrainingResumed(job.generation, step, pause, job.morph.decision_seconds, since, first, stalled)
    draft.event(resumed, job.id)
    fields["morph"] = replace(job.morph, paused_since=None)
    return fields
