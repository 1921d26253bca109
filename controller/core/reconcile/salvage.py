"""An unplanned loss: from the first survivor's failed collective to a just-in-time checkpoint (or a fallback).

The trainers of generation g whose collective failed hold the parameters and optimizer state of their
last completed step in memory and report it (``RankReport.held_step``). On the first such report the job
morphs with action HOLD, with ``morph.started_at`` as the time of the failure; then, pure and timed by
``draft.now`` (no heartbeat expiry is waited for):

1. **suspect**: a node of the generation that neither reported a failed collective (or an exit) nor was
   heard from since the first report, once ``suspect_grace_seconds`` have passed, is taken for lost
   (``NodesSuspected``) and left out of g+1; the morph's cause becomes ``node_lost`` naming it (the
   survivor whose collective failed only noticed, and the detail says so after the lost node's name);
   the ranks of the nodes heard from have until the grace plus the job's ``peer_timeout_seconds`` to
   report the step they hold (or exit);
2. **choose**: the newest step ``S`` that every pipeline stage has a holder of; one writer per stage (the
   lowest replica holding ``S``), so each layer is written once (``SalvageOrdered``), with a deadline;
   with no such step (a stage lost every replica, or the stages' holders differ), or ``S`` already
   checkpointed, the job falls back (``SalvageEnded`` with the reason) to ABORT, which resumes from the
   newest committed checkpoint as before;
3. **keep** (the job's ``morph_through_memory``, the default): no writer; the job goes on with STOP, the
   survivors keep ``S`` in memory as a planned stop's ranks do, and g+1 takes it from them and writes it in
   the background (``SalvageEnded`` reason ``in_memory``, ``source`` memory); a g+1 that cannot (a survivor gone
   meanwhile) resumes from the newest committed checkpoint and says so (``HeldStateSkipped``). Where the job
   took peer snapshots (:mod:`morphing.snapshots`) and a stage lost every replica, the newest step every stage
   has among the survivors' live steps and the snapshots they keep (:func:`from_snapshots`) is kept alike
   (``source`` snapshot, with the steps lost): g+1's exchange takes the lost stage from its copy's receiver;
4. **write** (otherwise): the writers write, the first one commits the manifest and reports the step, which the
   progress step records like any commit of the generation; the job then goes on with ABORT (every
   trainer of g has exited or is killed) and g+1 resumes from ``S``. A writer that fails or whose node is
   lost or silent for the grace (then suspected and left out of g+1 too), or a deadline that passes, falls back
   instead (``SalvageEnded``).

A collective that failed while every node is still heard from (a trainer crashed, or a step outlived
the peer timeout) counts as a restart, bounded by ``max_restarts`` like any trainer failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from controller.core.causes import JobFailureCause, MorphCause, SalvageOutcome
from controller.core.lifecycle import JobState
from controller.core.model import Action, JobRecord
from controller.core.reconcile.config import Config
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.reports import current_reports, observation
from controller.core.records import JobFields, Morph
from controller.eventlog import facts
from morphing.layout import Layout
from morphing.snapshots import Holding, Recovery, RecoverySource, choose_recovery, plan_snapshots

DEADLINE_MARGIN_SECONDS = 2.0  # past the writers' deadline: what a late report may still need


def holders(draft: Draft, job: JobRecord, names: tuple[str, ...] | None = None) -> dict[int, int]:
    """Rank -> the step it holds, for running ranks of the current generation whose collective failed."""
    return {r.rank: r.held_step for _, r in current_reports(draft, job, names) if r.held_step is not None and r.running}


def first_failure(draft: Draft, job_id: str) -> bool:
    """A rank of the running generation reports a failed collective: begin the salvage (True)."""
    job = draft.jobs[job_id]
    found = next(((n, r) for n, r in current_reports(draft, job) if r.held_step is not None and r.running), None)
    if found is None or job.layout is None:
        return False
    name, report = found
    replica, stage = job.layout.coords(report.rank)
    # The node that noticed is a survivor: the detail says so, and names the lost node once it is suspected.
    detail = f"collective failed after step {report.held_step}, noticed by {name} (rank {report.rank}, stage {stage}"
    detail += f", replica {replica})"
    draft.event(facts.CollectiveFailed(job.generation, report.rank, stage, replica, report.held_step), job_id, name)
    draft.start_morph(job_id, Action.HOLD, MorphCause.COLLECTIVE_FAILED, detail)
    return True


def choose(held: Mapping[int, int], stage_of: Mapping[int, int], stages: int) -> tuple[int, tuple[int, ...]] | None:
    """The newest step every stage has a holder of, and one writer per stage (its lowest rank); None if none."""
    for step in sorted(set(held.values()), reverse=True):
        writers = []
        for stage in range(stages):
            at = sorted(r for r, s in held.items() if s == step and stage_of[r] == stage)
            if not at:
                break
            writers.append(at[0])
        else:
            return step, tuple(writers)
    return None


def advance_salvage(draft: Draft, config: Config, job_id: str) -> None:
    """One pass of steps 1-3 of the module docstring for a job in HOLD."""
    job = draft.jobs[job_id]
    if job.salvage.writers:
        _watch_writers(draft, config, job)
    else:
        _decide(draft, config, job)


def _decide(draft: Draft, config: Config, job: JobRecord) -> None:
    layout = job.layout
    assert layout is not None
    failed_at = job.morph.started_at if job.morph.started_at is not None else draft.now
    serving = [n for n in job.nodes if draft.serves(job, n)]
    spoke = {n for n, r in current_reports(draft, job) if r.held_step is not None or not r.running}
    heard = [n for n in serving if n in spoke or ((seen := observation(draft, n)) and seen.last_seen >= failed_at)]
    waited = draft.now - failed_at
    if len(heard) < len(serving) and waited < config.suspect_grace_seconds:
        return
    suspected = tuple(n for n in job.nodes if n not in heard)
    on_heard = {r for r, slot in enumerate(layout.placement) if slot.node in heard}
    accounted = {r.rank for _, r in current_reports(draft, job, heard) if r.held_step is not None or not r.running}
    patience = config.suspect_grace_seconds + job.spec.peer_timeout_seconds
    if not on_heard <= accounted and waited < patience:
        return
    salvage = replace(job.salvage, suspected=suspected)
    excluded = tuple(sorted({*job.exclusions.nodes, *suspected}))
    fields: JobFields = {"salvage": salvage, "exclusions": replace(job.exclusions, nodes=excluded)}
    if suspected:
        draft.event(facts.NodesSuspected(job.generation, list(suspected)), job.id)
        suspect(draft, suspected)
        fields["morph"] = blamed(job, suspected)
    if not suspected:  # nothing was lost: a trainer failed or a step outlived the peer timeout
        if job.restarts + 1 > job.spec.max_restarts:
            draft.move_job(
                job.id,
                JobState.FAILED,
                f"collective failed with every node alive; max_restarts={job.spec.max_restarts}",
                failure_cause=JobFailureCause.COLLECTIVE_FAILED,
            )
            draft.release_nodes(job.id, job.nodes, "job failed")
            return
        fields["restarts"] = job.restarts + 1
    held = holders(draft, job, tuple(heard))
    stage_of = {r: layout.coords(r)[1] for r in held}
    chosen = choose(held, stage_of, layout.pipeline_stages)
    recovered = from_snapshots(draft, job, tuple(heard))
    if recovered is not None and (chosen is None or recovered.step > chosen[0]):
        _keep_snapshot(draft, job, fields, recovered)
        return
    if chosen is None:
        covered = set(stage_of.values())
        lost = [s for s in range(layout.pipeline_stages) if s not in covered]
        reason = SalvageOutcome.STAGE_LOST if lost else SalvageOutcome.NO_COMMON_STEP
        _fall_back(draft, job, reason, fields, stages_lost=lost)
        return
    step, writers = chosen
    if step <= job.last_checkpoint.step:
        _fall_back(draft, job, SalvageOutcome.ALREADY_COMMITTED, fields, step)
        return
    if job.spec.morph_through_memory:
        # The survivors keep step S as a planned stop's ranks do: stopped, they hold it for g+1, which takes it
        # from their memory and writes it in the background (nothing written or awaited here).
        holding = sorted(r for r, s in held.items() if s == step)
        behind = max(0, job.step - step)
        ended = facts.SalvageEnded(job.generation, SalvageOutcome.IN_MEMORY, step, holders=holding)
        draft.event(replace(ended, source=RecoverySource.MEMORY.value, steps_lost=behind), job.id)
        fields["salvage"] = replace(salvage, step=step)
        draft.act(job.id, Action.STOP, f"step {step} held in memory", **fields)
        return
    deadline = draft.now + config.salvage_write_seconds
    draft.event(facts.SalvageOrdered(job.generation, step, list(writers)), job.id)
    fields["salvage"] = replace(salvage, step=step, writers=writers, deadline=deadline)
    draft.amend_job(job.id, **fields)


def _watch_writers(draft: Draft, config: Config, job: JobRecord) -> None:
    assert job.layout is not None
    salvage = job.salvage
    if job.last_checkpoint.step >= salvage.step:  # the first writer's commit, recorded by progress
        draft.event(facts.SalvageEnded(job.generation, SalvageOutcome.COMMITTED, salvage.step), job.id)
        draft.act(job.id, Action.ABORT, f"salvaged step {salvage.step}")
        return
    writer_nodes = {job.layout.placement[w].node for w in salvage.writers}
    failed = [
        r.rank
        for _, r in current_reports(draft, job)
        if r.rank in salvage.writers and not r.running and r.exit_code != 0
    ]
    gone = sorted(
        n for n in writer_nodes if not draft.serves(job, n) or _silent(draft, n, config.suspect_grace_seconds)
    )
    if failed or gone:
        fields: JobFields = {}
        if gone:  # lost in the write: the generation does not wait for them, and g+1 leaves them out
            newly = [n for n in gone if n not in salvage.suspected]
            fields = {
                "salvage": replace(salvage, suspected=tuple(sorted({*salvage.suspected, *gone}))),
                "exclusions": replace(job.exclusions, nodes=tuple(sorted({*job.exclusions.nodes, *gone}))),
            }
            if newly:
                draft.event(facts.NodesSuspected(job.generation, newly), job.id)
                suspect(draft, newly)
                fields["morph"] = blamed(job, newly)
        _fall_back(draft, job, SalvageOutcome.WRITER_FAILED, fields, salvage.step, failed, gone)
    elif draft.now > salvage.deadline + DEADLINE_MARGIN_SECONDS:
        _fall_back(draft, job, SalvageOutcome.TIMED_OUT, {}, salvage.step)


def _fall_back(
    draft: Draft,
    job: JobRecord,
    reason: SalvageOutcome,
    fields: JobFields,
    step: int | None = None,
    writers_failed: list[int] | None = None,
    nodes_gone: list[str] | None = None,
    stages_lost: list[int] | None = None,
) -> None:
    """Give the salvage up (or need none): ABORT resumes from the newest committed checkpoint, as before."""
    ended = facts.SalvageEnded(
        job.generation,
        reason,
        step,
        writers_failed=writers_failed,
        nodes_gone=nodes_gone,
        stages_lost=stages_lost,
        resume_step=job.last_checkpoint.step,
        source=RecoverySource.CHECKPOINT.value,
        steps_lost=max(0, job.step - job.last_checkpoint.step),
    )
    draft.event(ended, job.id)
    draft.act(job.id, Action.ABORT, f"{reason}: resuming from step {job.last_checkpoint.step}", **fields)


def snapshots_protect(layout: Layout | None, interval: int) -> bool:
    """The job's generation took peer snapshots (:mod:`morphing.snapshots`): the trainers compute the same plan."""
    return layout is not None and interval > 0 and plan_snapshots(layout).active


def from_snapshots(draft: Draft, job: JobRecord, heard: tuple[str, ...]) -> Recovery | None:
    """The newest complete step among the survivors' live steps and the peer snapshots they say they keep, when
    only the snapshots complete it (None otherwise: the live steps or the checkpoint decide, as without)."""
    layout = job.layout
    if layout is None or not job.spec.morph_through_memory or not snapshots_protect(layout, job.spec.snapshot_interval):
        return None
    holdings = {
        r.rank: Holding(r.held_step, frozenset(r.snapshot_own_steps), frozenset(r.snapshot_received_steps))
        for _, r in current_reports(draft, job, heard)
        if r.held_step is not None and r.running
    }
    newest = max([job.step, *(h.live for h in holdings.values() if h.live is not None)])
    recovery = choose_recovery(layout, plan_snapshots(layout), holdings, job.last_checkpoint.step, newest)
    return recovery if recovery.source is RecoverySource.SNAPSHOT else None


def _keep_snapshot(draft: Draft, job: JobRecord, fields: JobFields, recovery: Recovery) -> None:
    """Step 3 from peer snapshots: the survivors keep them as they keep their live step, and g+1 is named the
    snapshot's step (its exchange takes a lost stage's layers from the rank that received its copy)."""
    step = recovery.step
    holding = sorted(
        r.rank
        for _, r in current_reports(draft, job)
        if r.held_step is not None and r.running and step in (r.held_step, *r.snapshot_own_steps)
    )
    ended = facts.SalvageEnded(job.generation, SalvageOutcome.IN_MEMORY, step, holders=holding)
    draft.event(replace(ended, source=recovery.source.value, steps_lost=recovery.steps_lost), job.id)
    fields["salvage"] = replace(fields.get("salvage", job.salvage), step=step)
    draft.act(job.id, Action.STOP, f"step {step} held in peer snapshots", **fields)


def blamed(job: JobRecord, lost: Sequence[str]) -> Morph:
    """The job's morph caused by the nodes ``lost`` (suspected, then LOST at the heartbeat expiry), not by the
    survivor whose collective failed first: the cause a user reads names the node that died; the survivor that
    noticed stays in the detail after it."""
    named = ", ".join(lost)
    return replace(job.morph, cause=MorphCause.NODE_LOST, detail=f"{named} lost without notice; {job.morph.detail}")


def suspect(draft: Draft, names: Iterable[str]) -> None:
    """Mark ``names`` suspected for every job, not only the one whose collective failed: the pass that releases
    them must not give them to another job (:func:`controller.core.reconcile.draft.free_nodes`)."""
    for name in names:
        if name in draft.nodes:
            draft.amend_node(name, suspected_at=draft.now)


def _silent(draft: Draft, name: str, grace: float) -> bool:
    """Not heard from for ``grace`` (agents beat several times a second while their job holds)."""
    seen = observation(draft, name)
    return seen is None or draft.now - seen.last_seen > grace
