"""The planner that learns (``scheduler.learning``): after each morph, the step time the job measures is checked
against the planner's prediction, and the job's correction learns from it.

Once a generation has run two steps past the one it resumed at (the first step after a morph carries its
warm-up), its newest rate (``JobRecord.training``) gives the measured step time. ``StepTimeChecked`` says the
planner's prediction, the prediction corrected by what the job measured before (``error_after``: out of sample)
and both errors; the measurement then joins the job's observations (``JobRecord.learning``), which correct its
throughput curve for the scheduler (:mod:`~controller.core.reconcile.views`) and its growth candidates
(:mod:`~controller.core.reconcile.growth`).

A generation issued by a growth is also judged against the rate measured when the growth was decided
(``judge_growth``): slower, and the job goes back off the nodes it added (a planned STOP, cause
``growth_undone``), which it leaves out for ``growth_undo_seconds`` and is never grown onto again (``avoid``).
"""

from __future__ import annotations

from dataclasses import replace

from controller.core.causes import MorphCause
from controller.core.lifecycle import JobState
from controller.core.model import Action, JobRecord
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.generation import planned
from controller.core.reconcile.unreachable import exclude_until
from controller.core.reconcile.views import model
from controller.eventlog.scheduler_facts import GrowthUndone, StepTimeChecked
from morphing.planner import Plan, Planner
from scheduler import learning

WARM_STEPS = 2  # steps after the one a generation resumed at before its rate counts


def learn(draft: Draft, config: Config, planners: Planners) -> None:
    for job_id in sorted(draft.jobs):
        job = draft.jobs[job_id]
        if (
            job.state is JobState.RUNNING
            and job.action is Action.RUN
            and job.generation > job.learning.checked_generation
        ):
            check(draft, config, planners, job)


def check(draft: Draft, config: Config, planners: Planners, job: JobRecord) -> None:
    trained = job.training
    if trained.generation != job.generation or not trained.samples_per_second or job.layout is None:
        return
    if trained.step < job.resumed_at_step + WARM_STEPS:
        return
    planner = planners.get(job.id)
    predicted = planned(draft, job.id, planner.evaluate, job.layout) if isinstance(planner, Planner) else None
    if not isinstance(predicted, Plan) or predicted.samples_per_second <= 0:
        return
    batch = job.spec.global_batch
    gpus = predicted.gpus_used
    before_s, measured_s = batch / predicted.samples_per_second, batch / trained.samples_per_second
    corrected_s = model(job.learning).correct(before_s, gpus)
    error_before = abs(before_s - measured_s) / measured_s
    error_after = abs(corrected_s - measured_s) / measured_s
    learned = learning.observe(model(job.learning), gpus, before_s, measured_s)
    record = replace(
        job.learning,
        observations=tuple((o.gpus, o.predicted_seconds, o.measured_seconds) for o in learned.observations),
        checked_generation=job.generation,
        error_before=error_before,
        error_after=error_after,
        growth_from=None,
        grown_from=(),
    )
    said = StepTimeChecked(job.generation, gpus, before_s, corrected_s, measured_s, error_before, error_after)
    draft.event(said, job.id)
    grown = job.morph.cause is MorphCause.GROW and job.learning.growth_from is not None
    if not grown or job.learning.growth_from is None:
        draft.amend_job(job.id, learning=record)
        return
    added = sorted(set(job.nodes) - set(job.learning.grown_from))
    verdict = learning.judge_growth(job.learning.growth_from, trained.samples_per_second, added)
    if not verdict.undo or not added:
        draft.amend_job(job.id, learning=record)
        return
    record = replace(record, avoid=(*record.avoid, tuple(added)))
    until = draft.now + config.growth_undo_seconds
    exclusions = replace(job.exclusions, until=exclude_until(job, added, until, draft.now))
    undone = GrowthUndone(job.generation, added, job.learning.growth_from, trained.samples_per_second, verdict.detail)
    draft.event(undone, job.id)
    detail = f"growth undone: {verdict.detail}; off {', '.join(added)}"
    draft.start_morph(job.id, Action.STOP, MorphCause.GROWTH_UNDONE, detail, learning=record, exclusions=exclusions)


def growth_allowed(job: JobRecord, added: list[str]) -> bool:
    """Whether a growth onto ``added`` retries none of the job's growths undone before."""
    return learning.growth_allowed(added, [frozenset(nodes) for nodes in job.learning.avoid])


def correction(job: JobRecord, current_gpus: int, candidate_gpus: int) -> float:
    """How much the job's learned correction changes a candidate's predicted speed relative to the current's:
    the candidate's predicted samples/s times this is what the job's measurements say to expect."""
    step_model = model(job.learning)
    return step_model.factor(current_gpus) / step_model.factor(candidate_gpus)
