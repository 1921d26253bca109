"""On-demand capacity for deadlines: the controller's half of ``scheduler.decide``.

Each pass, while some live job may use on-demand capacity (``on_demand: allowed`` with a deadline) or on-demand
nodes or holds exist, the jobs and nodes are shown to the scheduler as values (each job's throughput curve from
its planner, corrected by what it measured: :mod:`~controller.core.reconcile.learn`; its work left, deadline and
cap; the nodes present with their pool and owner) with the spot pool's forecast rates, and its decision is
carried out:

- a job's on-demand level (``JobRecord.on_demand``: GPUs, ``CapacityCause``, the numbers behind it) follows its
  need, a rise only once no spot node is still arriving (:func:`spot_arriving`); a rise is ``OnDemandRequested``,
  and the runner asks the provider for the sum of the levels (:func:`~controller.core.capacity.wanted_on_demand`);
- an on-demand node that arrives (its pool known from the provider's list) goes to the job whose level it fills
  (``NodeRecord.owner``); it serves that job only (:func:`~controller.core.reconcile.devices.may_run_on`);
- a node the decision gives back loses its owner (``OnDemandReleased``): released at once when free, else its job
  moves off it in a planned morph (STOP, cause ``on_demand_returned``) and it is released once free.

The decision is the pass's one (:func:`~controller.core.reconcile.sharing.schedule`), whose grants also share the
spot GPUs when several jobs are live. The pool's history (:func:`observe_pools`) is counted every pass.
"""

from __future__ import annotations

import math
from dataclasses import replace

from controller.core.causes import MorphCause
from controller.core.lifecycle import JOB_LIVE, JobState, NodeState
from controller.core.model import Action, JobRecord, ReleaseInstance, SetPoolStats
from controller.core.reconcile.config import Config
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.sharing import Scheduled
from controller.core.reconcile.views import PRESENT
from controller.core.records import OnDemandHold
from controller.eventlog.scheduler_facts import OnDemandReleased, OnDemandRequested
from scheduler import forecast
from scheduler.deadlines import CapacityCause
from scheduler.jobs import JobView
from scheduler.pools import PoolKind


def observe_pools(draft: Draft) -> None:
    """Each pool's history advanced to now when its count of live nodes changed; a spot node fewer is an eviction
    (the controller gives spot nodes back only once they are gone), an on-demand node fewer never is."""
    for kind in PoolKind:
        live = sum(1 for n in draft.nodes.values() if n.pool is kind and n.state in PRESENT)
        stats = draft.pools.get(kind, forecast.PoolStats(kind))
        if (stats.at is not None and live == stats.live) or (stats.at is not None and draft.now < stats.at):
            continue
        evicted = max(0, stats.live - live) if kind is PoolKind.SPOT and stats.at is not None else 0
        draft.pools[kind] = forecast.observe(stats, draft.now, live, evicted)
        draft.issue(SetPoolStats(draft.pools[kind]))


def plan_on_demand(draft: Draft, config: Config, scheduled: Scheduled | None) -> None:
    """The pass's decision on on-demand capacity carried out (None: no job may use it and none is held)."""
    if scheduled is None or not scheduled.on_demand:
        return
    views, decision, rates = scheduled.views, scheduled.decision, scheduled.rates
    needs = {need.job: need for need in decision.on_demand}
    arriving = spot_arriving(draft, config.debounce_seconds)
    for job_view in views:
        need = needs.get(job_view.name)
        gpus = need.gpus if need else 0
        if arriving and gpus > draft.jobs[job_view.name].on_demand.gpus:
            continue  # spot nodes are still joining: the deadline counts them once they are ready, as admission does
        _hold(draft, job_view, gpus, need.cause if need else None, rates, config)
    for job in draft.jobs.values():
        if job.state not in JOB_LIVE and job.on_demand.gpus:
            spent = job.on_demand.returned_gpu_seconds
            draft.amend_job(job.id, on_demand=OnDemandHold(since=draft.now, returned_gpu_seconds=spent))
    for change in decision.capacity:
        if change.release_nodes:
            give_back(draft, change.job, change.release_nodes, str(change.cause))
    _claim_arrivals(draft)
    _release_ownerless(draft)


def spot_arriving(draft: Draft, debounce_seconds: float) -> bool:
    """A spot node registered within the debounce window and given no work yet (joining, or ready and free): the spot
    capacity a deadline counts on is still arriving, so no on-demand level rises on its absence (a cluster's first
    seconds, a burst of returning VMs)."""
    return any(
        n.pool is PoolKind.SPOT
        and n.state in (NodeState.JOINING, NodeState.READY)
        and n.job is None
        and draft.now - n.joined_at < debounce_seconds
        for n in draft.nodes.values()
    )


def _hold(
    draft: Draft, job: JobView, gpus: int, cause: CapacityCause | None, rates: forecast.Rates, config: Config
) -> None:
    """The job's on-demand level and why, with the numbers behind it; a rise is said (``OnDemandRequested``)."""
    record = draft.jobs[job.name]
    before = record.on_demand
    spot = job.held_gpus(PoolKind.SPOT)
    per_node = max(1, config.scheduler.gpus_per_node)
    left = (job.deadline - draft.now) if job.deadline is not None else None
    horizon = max(left or 0.0, 0.0)
    nodes = -(-spot // per_node)
    alone = forecast.liveput(job.rate, nodes, per_node, 0, rates, horizon, job.morph_cost_seconds)
    both = forecast.liveput(job.rate, nodes, per_node, gpus, rates, horizon, job.morph_cost_seconds)
    hold = OnDemandHold(
        gpus=gpus,
        cause=cause if gpus or before.gpus else None,
        since=before.since if gpus == before.gpus else draft.now,
        deadline_in_seconds=left,
        remaining_samples=job.remaining_samples,
        spot_gpus=spot,
        spot_samples_per_second=alone,
        with_on_demand_samples_per_second=both,
        finish_seconds=job.remaining_samples / alone if alone > 0 else None,
        returned_gpu_seconds=before.returned_gpu_seconds,
    )
    if gpus == before.gpus and hold.cause == before.cause:
        return  # the numbers move every pass: stored when the level or its cause changes, not on every tick
    draft.amend_job(job.name, on_demand=hold)
    if gpus > before.gpus and hold.cause is not None:
        said = OnDemandRequested(
            gpus,
            before.gpus,
            str(hold.cause),
            left or 0.0,
            job.remaining_samples,
            spot,
            alone,
            both,
            hold.finish_seconds,
            rates.eviction * 3600.0,
        )
        draft.event(said, job.name)


def give_back(draft: Draft, job_id: str, names: tuple[str, ...], cause: str) -> None:
    gpus = sum(draft.nodes[n].slots for n in names if n in draft.nodes)
    used = sum(draft.nodes[n].slots * max(0.0, draft.now - draft.nodes[n].joined_at) for n in names if n in draft.nodes)
    if job_id in draft.jobs and used:  # what they cost counts in the job's on-demand cost from now on
        hold = draft.jobs[job_id].on_demand
        draft.amend_job(job_id, on_demand=replace(hold, returned_gpu_seconds=hold.returned_gpu_seconds + used))
    busy = [n for n in names if n in draft.nodes and draft.nodes[n].job is not None]
    detail = f"{', '.join(busy)} still run it: released once it moved off" if busy else "released now"
    for name in names:
        if name in draft.nodes:
            draft.amend_node(name, owner=None)
    draft.event(OnDemandReleased(list(names), gpus, cause, detail), job_id)


def _claim_arrivals(draft: Draft) -> None:
    """Free on-demand nodes without an owner go to the jobs whose on-demand level they fill (earliest deadline
    first); one a job already runs on (admitted onto it before the provider's list named its pool) goes to that
    job when it fills its level; the rest are released by :func:`_release_ownerless`."""
    for node in sorted(draft.nodes.values(), key=lambda n: n.name):
        if node.pool is not PoolKind.ON_DEMAND or node.owner is not None:
            continue
        if node.job is not None:
            runs = draft.jobs.get(node.job)
            if runs is not None and runs.state in JOB_LIVE and node.state in PRESENT and _deficit(draft, runs) > 0:
                draft.amend_node(node.name, owner=runs.id)
            continue
        if node.state not in (NodeState.JOINING, NodeState.READY):
            continue
        short = [j for j in draft.jobs.values() if j.state in JOB_LIVE and _deficit(draft, j) > 0]
        if short:
            first = min(short, key=lambda j: (j.spec.deadline_seconds() or math.inf, j.id))
            draft.amend_node(node.name, owner=first.id)


def _deficit(draft: Draft, job: JobRecord) -> int:
    ours = sum(n.slots for n in draft.nodes.values() if n.owner == job.id and n.state in PRESENT)
    return job.on_demand.gpus - ours


def _release_ownerless(draft: Draft) -> None:
    """On-demand nodes nobody owns: given back to the provider when free, moved off (a planned stop) when not."""
    for node in sorted(draft.nodes.values(), key=lambda n: n.name):
        if node.pool is not PoolKind.ON_DEMAND or node.owner is not None or node.state not in PRESENT:
            continue
        if node.job is None:
            draft.move_node(node.name, NodeState.GONE, "on-demand capacity given back to the provider")
            draft.issue(ReleaseInstance(node.name))
            continue
        job = draft.jobs.get(node.job)
        if job is not None and job.state is JobState.RUNNING and job.action is Action.RUN:
            why = f"on-demand node {node.name} given back: moving off it"
            draft.start_morph(job.id, Action.STOP, MorphCause.ON_DEMAND_RETURNED, why)
