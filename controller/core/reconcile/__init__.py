"""Reconcile: a pure function from (world, now) to commands.

No I/O and no clock: the caller passes ``now`` and a planner per job. The steps run in a fixed order
on one :class:`~controller.core.reconcile.draft.Draft`, passive ones first (what happened to nodes,
how far jobs got), then active ones (the morph protocol, the planner's prediction checked and a growth that
measured slower undone, the pools' history, the scheduler's decision: on-demand capacity for deadlines and,
with several jobs live, spot GPUs shared by its grants and jobs shrunk for others; admission, moves off nodes
at risk of eviction, growth), so later steps see
earlier decisions. Reports of any other incarnation or generation never change a job
(:mod:`~controller.core.reconcile.reports`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Unpack

from controller.core.causes import JobFailureCause
from controller.core.intake import Stale
from controller.core.lifecycle import JOB_ACTIVE, JOB_TERMINAL, JobState, NodeState
from controller.core.model import Action, Assignment, Command, SalvageOrder, World, ranks_by_node
from controller.core.reconcile.admission import admit_queued
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.devices import spec_for_generation
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import fail_unplannable
from controller.core.reconcile.growth import grow
from controller.core.reconcile.health import node_health
from controller.core.reconcile.learn import learn
from controller.core.reconcile.morph import advance_morph, supervise
from controller.core.reconcile.on_demand import observe_pools, plan_on_demand
from controller.core.reconcile.progress import progress
from controller.core.reconcile.risk import move_off_risk
from controller.core.reconcile.sharing import schedule, shrink
from controller.core.records import MoveFields
from controller.core.retention import forget_gone

__all__ = ["Config", "Planners", "assignment_for", "cancel", "fail", "free_nodes", "reconcile"]


def reconcile(world: World, now: float, config: Config, planners: Planners) -> list[Command]:
    draft = Draft(world, now)
    node_health(draft, config)
    for job_id in sorted(draft.jobs):
        if draft.jobs[job_id].state in JOB_ACTIVE:
            progress(draft, job_id, config.progress_event_seconds)
    for job_id in sorted(draft.jobs):
        if draft.jobs[job_id].state is JobState.RUNNING:
            supervise(draft, config, job_id)
        if draft.jobs[job_id].state is JobState.MORPHING:
            advance_morph(draft, config, planners, job_id)
    learn(draft, config, planners)
    observe_pools(draft)
    scheduled = schedule(draft, config, planners)
    plan_on_demand(draft, config, scheduled)
    shrink(draft, scheduled)
    admit_queued(draft, config, planners, scheduled)
    move_off_risk(draft, config, planners)
    grow(draft, config, planners, scheduled)
    fail_unplannable(draft)
    forgotten = forget_gone(world, now, config.gone_retention_seconds, config.damping.flap_memory_seconds)
    return [*draft.commands, *forgotten]


def assignment_for(
    world: World, node_name: str, ranks_of: Mapping[str, tuple[int, ...]] | None = None
) -> Assignment | None:
    """The assignment a node's heartbeat gets back; ``None``: run nothing.

    ``ranks_of``: ``ranks_by_node`` of the node's job's layout when the caller keeps it (it is the same
    for every heartbeat of a generation); computed here otherwise.
    """
    node = world.nodes.get(node_name)
    if node is None or node.job is None or node.state is NodeState.GONE:
        return None
    job = world.jobs.get(node.job)
    if job is None or job.layout is None or job.state not in JOB_ACTIVE:
        return None
    if ranks_of is None:
        ranks_of = ranks_by_node(job.layout)
    # A shrink's stop is started by the nodes that leave: their ranks say they leave in the same agreement that
    # stops every rank, so all hand off alike. Were the nodes kept asked too, one could start the stop before a
    # leaving node knew it leaves, whose ranks would then hold their stage instead of handing it over.
    kept = job.morph.keep_only or ()
    shrinking = job.action is Action.STOP and job.morph.keep_only is not None
    ranks = ranks_of.get(node_name, ())
    if not ranks:
        return None
    return Assignment(
        job=job.id,
        generation=job.generation,
        ranks=ranks,
        slots=tuple(job.layout.placement[r].slot for r in ranks),
        layout=job.layout,
        rendezvous=job.rendezvous,
        checkpoint_dir=job.spec.checkpoint_dir,
        resume=job.resume,
        action=job.action,
        entrypoint=job.spec.entrypoint,
        spec=spec_for_generation(job, world.nodes),
        checkpoint_request=job.checkpoint_request,
        salvage=SalvageOrder(job.salvage.step, job.salvage.writers, job.salvage.deadline)
        if job.action is Action.HOLD and job.salvage.writers
        else None,
        held=job.held,
        leaving=shrinking and node_name not in kept,
        await_leavers=shrinking and node_name in kept,
    )


def cancel(world: World, job_id: str, now: float, who: str) -> list[Command]:
    """Commands that cancel a job and free its nodes (its agents then stop their trainers).

    :class:`Stale` when the job ended meanwhile (two cancels at once, or it finished first).
    """
    job = world.jobs[job_id]
    if job.state in JOB_TERMINAL:
        raise Stale(f"job {job_id} already {job.state}")
    return _end(world, job_id, now, JobState.CANCELLED, f"cancelled by {who}")


def fail(world: World, job_id: str, now: float, reason: str) -> list[Command]:
    """Commands that fail a job the controller cannot decide on, and free its nodes."""
    return _end(world, job_id, now, JobState.FAILED, reason, failure_cause=JobFailureCause.DECISIONS_FAILED)


def _end(
    world: World, job_id: str, now: float, state: JobState, reason: str, **fields: Unpack[MoveFields]
) -> list[Command]:
    draft = Draft(world, now)
    job = draft.jobs[job_id]
    draft.move_job(job_id, state, reason, **fields)
    draft.release_nodes(job.id, job.nodes)
    return draft.commands
