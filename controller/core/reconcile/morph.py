"""The morph protocol, with generations as fencing tokens.

- planned (eviction notice, eviction risk with spare capacity, growth): action STOP for generation g;
  trainers agree on a step boundary, checkpoint (or keep the step in memory) and exit 0; then generation
  g+1 is planned on the nodes left (:func:`next_plan`) and resumes from that checkpoint;
- unplanned, seen by a survivor (a failed collective): action HOLD while the survivors' last completed
  step is salvaged (:mod:`~controller.core.reconcile.salvage`), then ABORT and g+1 resumes from it;
- unplanned otherwise (node lost by heartbeat expiry, trainer failed), or a salvage that falls back:
  action ABORT for the survivors, then g+1 resumes from the newest committed checkpoint;
- a trainer that refused its input (exit 2) is never restarted as it was
  (:mod:`~controller.core.reconcile.refusals`).

Generation g+1 is issued only when no rank of generation g still runs (or its node is gone), so two
generations never share a slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Action
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import fit, planned, start_generation
from controller.core.reconcile.holders import holders_to_keep, prefer_holders
from controller.core.reconcile.refusals import refused
from controller.core.reconcile.reports import census, current_reports, first_error, start_failures
from controller.core.reconcile.risk import clear_of_risk
from controller.core.reconcile.salvage import advance_salvage, first_failure, snapshots_protect
from controller.core.reconcile.unreachable import (
    Verdict,
    exclude_until,
    judge,
    rendezvous_edges,
    still_excluded,
)
from controller.core.records import Exclusions, JobRecord, NodeRecord
from controller.eventlog import facts
from morphing.planner import Plan, Planner

J = JobState


def supervise(draft: Draft, config: Config, job_id: str) -> None:
    """A running job succeeds, fails, or starts a morph when a node or a trainer is gone or going."""
    job = draft.jobs[job_id]
    counted = census(draft, job)
    if finish_if_done(draft, job_id, counted.finished):
        return
    lost = [n for n in job.nodes if not draft.serves(job, n)]
    draining = [n for n in job.nodes if draft.serves(job, n) and draft.nodes[n].state is NodeState.DRAINING]
    if first_failure(draft, job_id):  # survivors hold their last step: salvage it (reconcile.salvage)
        return
    if lost:
        draft.start_morph(job_id, Action.ABORT, MorphCause.NODE_LOST, f"node lost: {', '.join(lost)}")
    elif counted.failed:
        _trainers_failed(draft, config, job_id, counted.failed)
    elif draining:
        draft.start_morph(job_id, Action.STOP, MorphCause.EVICTION, f"eviction notice: {', '.join(draining)}")


def _trainers_failed(draft: Draft, config: Config, job_id: str, failed: int) -> None:
    """Fail at once on a user error, or leave out the nodes that cannot run the job
    (:mod:`~controller.core.reconcile.refusals`); leave out a node its peers cannot reach
    (:mod:`~controller.core.reconcile.unreachable`), or the nodes where trainers could not start; otherwise
    restart, up to ``max_restarts``."""
    if refused(draft, job_id):
        return
    job = draft.jobs[job_id]
    unstarted = start_failures(draft, job)
    if unstarted and len(unstarted) < len(job.nodes):
        for name, error in sorted(unstarted.items()):
            draft.event(facts.TrainerStartFailed(job.generation, error), job_id, name)
        edges = rendezvous_edges(job, unstarted, draft.now)
        verdict = judge(job, edges, draft.now, config.unreachable_memory_seconds)
        if verdict.implicated:
            _implicated(draft, config, job_id, unstarted, verdict)
            return
        names = ", ".join(sorted(unstarted))
        excluded = tuple(sorted({*job.exclusions.nodes, *unstarted}))
        detail = f"trainers could not start on {names}; re-planning without it"
        exclusions = replace(job.exclusions, nodes=excluded, rendezvous_failures=verdict.edges)
        draft.start_morph(job_id, Action.ABORT, MorphCause.TRAINER_START_FAILED, detail, exclusions=exclusions)
        return
    why = next(iter(unstarted.values()), "") or first_error(draft, job)
    if job.restarts + 1 > job.spec.max_restarts:
        reason = f"{failed} trainer(s) failed; max_restarts={job.spec.max_restarts}"
        cause = JobFailureCause.TRAINERS_FAILED
        draft.move_job(job_id, J.FAILED, f"{reason}: {why}" if why else reason, failure_cause=cause)
        draft.release_nodes(job_id, job.nodes, "job failed")
        return
    detail = f"{failed} trainer(s) failed"
    draft.start_morph(job_id, Action.ABORT, MorphCause.TRAINER_FAILED, detail, restarts=job.restarts + 1)


def _implicated(draft: Draft, config: Config, job_id: str, unstarted: Mapping[str, str], verdict: Verdict) -> None:
    """Leave the implicated nodes out for a while; take back the nodes whose failures they explain."""
    job = draft.jobs[job_id]
    until = draft.now + config.unreachable_exclusion_seconds
    for name, partners in verdict.implicated.items():
        draft.event(facts.NodeImplicated(job.generation, list(partners), until), job_id, name)
    names = ", ".join(f"{n} (by {', '.join(p)})" for n, p in verdict.implicated.items())
    seconds = config.unreachable_exclusion_seconds
    detail = f"peers could not reach {names}; left out for {seconds:g} s"
    draft.start_morph(
        job_id,
        Action.ABORT,
        MorphCause.PEER_UNREACHABLE,
        detail,
        exclusions=Exclusions(
            still_excluded(job, unstarted, verdict),
            verdict.edges,
            exclude_until(job, verdict.implicated, until, draft.now),
        ),
    )


def finish_if_done(draft: Draft, job_id: str, finished: bool) -> bool:
    """Every rank finished the last step: the job succeeded and lets go of its nodes."""
    if finished:
        job = draft.jobs[job_id]
        draft.move_job(job_id, J.SUCCEEDED, f"finished step {job.spec.steps}")
        draft.release_nodes(job_id, job.nodes, "job succeeded")
    return finished


def holders_needed(job: JobRecord, keep: list[str]) -> tuple[str, ...]:
    """The nodes of ``keep`` g+1 must include to take the stopped step from memory (none when it is not
    taken from memory, or is the committed checkpoint, which gives any layer no one holds)."""
    held = job.salvage.step or job.step
    through_memory = job.action is Action.STOP and job.spec.morph_through_memory and job.generation > 0
    if not through_memory or job.layout is None or held <= job.last_checkpoint.step:
        return ()
    # A salvage from peer snapshots: a lost stage's copy may be on any kept node (its receiver), as after a hand-off.
    snapshot = bool(job.salvage.step) and snapshots_protect(job.layout, job.spec.snapshot_interval)
    return holders_to_keep(job.layout, keep, handed_off=not job.salvage.step or snapshot)


def advance_morph(draft: Draft, config: Config, planners: Planners, job_id: str) -> None:
    """Escalate a STOP that cannot finish; once the old generation is quiet, issue the next (or queue)."""
    job = draft.jobs[job_id]
    started = job.morph.started_at if job.morph.started_at is not None else draft.now
    if job.action is Action.HOLD:
        advance_salvage(draft, config, job_id)
        job = draft.jobs[job_id]
        if job.action is Action.HOLD or job.state is not J.MORPHING:
            return
    if job.action is Action.STOP:
        gone = [n for n in job.nodes if not draft.serves(job, n) and n not in job.salvage.suspected]
        if gone or draft.now - started > config.stop_timeout_seconds:
            why = f"node gone while stopping: {', '.join(gone)}" if gone else "stop timed out"
            draft.act(job_id, Action.ABORT, why)  # the same cause
            job = draft.jobs[job_id]
    counted = census(draft, job)
    if finish_if_done(draft, job_id, counted.finished):
        return
    given_up = job.action is Action.ABORT and draft.now - started > config.abort_timeout_seconds
    if not counted.quiet and not given_up:
        return
    said = next((r for _, r in current_reports(draft, job) if r.hand_off_failed), None)
    if said is not None:  # this pass ends the generation's stop: said once
        draft.event(facts.HandOffFailed(job.generation, said.last_step, said.hand_off_failed), job_id)
    keep = [n for n in job.nodes if draft.assigned(job, n) and n not in job.salvage.suspected]
    draft.release_nodes(job_id, job.nodes, f"generation {job.generation} of {job_id} ended")
    plan = next_plan(draft, planners, job, keep)
    if plan is None:
        shrunk = job.morph.cause is MorphCause.SHRUNK
        why = "shrunk to no GPUs for another job; queued" if shrunk else "no layout fits the nodes left"
        draft.move_job(job_id, J.QUEUED, f"{why}; waiting for capacity")
        return
    cause = job.morph.cause if job.morph.cause is not None else MorphCause.OTHER  # set on entering MORPHING
    start_generation(draft, config, job_id, plan, cause, job.morph.detail, stopped=job.action is Action.STOP)


def next_plan(draft: Draft, planners: Planners, job: JobRecord, keep: list[str]) -> Plan | None:
    """Generation g+1 on the nodes kept and free ones. Free nodes at risk of eviction are offered only when
    nothing fits without them (never to a growth); nodes at risk are kept only while nothing as fast does
    without them and no step held in memory needs them (:func:`~controller.core.reconcile.risk.clear_of_risk`).
    A job shrunk for another (:mod:`~controller.core.reconcile.sharing`) is planned on the nodes granted to it alone.
    """
    shrunk = job.morph.keep_only
    keep = keep if shrunk is None else [n for n in keep if n in shrunk]
    holders = holders_needed(job, keep)
    free = [n for n in free_nodes(draft.nodes) if n.name not in keep and shrunk is None]
    clear_free = [n for n in free if n.at_risk is None]
    plan = _placed(draft, planners, job.id, keep, holders, clear_free)
    if plan is None and job.morph.cause is not MorphCause.GROW:
        plan = _placed(draft, planners, job.id, keep, holders, free)
    if plan is None or job.layout is None or all(draft.nodes[n].at_risk is None for n in plan.layout.nodes()):
        return plan
    clear = [n for n in keep if draft.nodes[n].at_risk is None]
    clear_holders = holders_to_keep(job.layout, clear, handed_off=False) if holders else ()
    if holders and (not clear_holders or not set(job.nodes) <= set(keep)):
        return plan  # a node at risk may hold a layer of the step kept in memory that no other node holds
    planner = planners.get(job.id)
    before = planned(draft, job.id, planner.evaluate, job.layout) if isinstance(planner, Planner) else None
    safe = _placed(draft, planners, job.id, clear, clear_holders, clear_free)
    return clear_of_risk(plan, safe, before.samples_per_second if isinstance(before, Plan) else None)


def _placed(
    draft: Draft, planners: Planners, job_id: str, keep: list[str], holders: tuple[str, ...], free: list[NodeRecord]
) -> Plan | None:
    """The best plan on ``keep`` (``holders`` first: a small layout reaches them), then ``free``; one that reaches
    the holders unless it is much slower (:func:`~controller.core.reconcile.holders.prefer_holders`)."""
    ordered = [*holders, *(n for n in keep if n not in holders)]
    nodes = [(n, draft.nodes[n].slots) for n in ordered] + [(n.name, n.slots) for n in free]
    plan = fit(draft, planners, job_id, nodes)
    if plan is not None and not set(holders) <= set(plan.layout.nodes()):
        plan = prefer_holders(plan, fit(draft, planners, job_id, nodes, sum(draft.nodes[n].slots for n in holders)))
    return plan
