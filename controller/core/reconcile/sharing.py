"""The pass's one scheduling decision (``scheduler.decide``), and spot GPUs shared among jobs by its grants.

:func:`schedule` shows the live jobs and the nodes any job can rely on to the scheduler
(:mod:`~controller.core.reconcile.views`) once a pass, when two or more jobs are live or on-demand capacity is in
play; on-demand capacity follows its needs (:mod:`~controller.core.reconcile.on_demand`). With two or more live
jobs its grants divide the spot GPUs: each job's share by the samples/s the GPUs add to it, weighted by priority,
aged while it waits, none starved (:mod:`scheduler.allocation`):

- a queued job is admitted on the nodes granted to it once every one of them is free (a shrinking job may still
  hold some; :func:`admit_granted`);
- a running job grows only onto free nodes granted to no other job, where growth pays as always
  (:func:`~controller.core.reconcile.growth.grow`);
- a running job the decision shrinks (a higher-priority job gains more over the horizon than it loses, both morphs
  paid; or a job waited ``starvation_seconds``) stops in a planned morph (``MorphCause.SHRUNK``, ``JobShrunk``)
  and its next generation is planned on the nodes granted to it alone (``Morph.keep_only``), taking the stopped
  step from their memory: the nodes given up leave at the stop (``Assignment.leaving``) and hand the layers only
  they hold to the nodes kept, as on an eviction notice. Shrunk to nothing, the stop writes its step and the job
  queues.

With one live job there is nothing to share: admission takes the free nodes in the queue's order
(:mod:`scheduler.queue`) and growth weighs what the job measured. A node granted in part to two jobs (a node of
several GPUs) goes whole to the job granted most of it: the controller gives a node to one job at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from controller.core.causes import MorphCause
from controller.core.lifecycle import JOB_LIVE, JobState
from controller.core.model import Action, JobRecord, World
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import fit, start_generation
from controller.core.reconcile.views import PRESENT, scheduler_nodes, spot_rates, view
from controller.eventlog.scheduler_facts import JobShrunk
from morphing.planner import Plan
from scheduler import forecast
from scheduler.allocation import Shrink
from scheduler.jobs import JobView
from scheduler.policy import Decision, decide
from scheduler.pools import PoolKind
from scheduler.queue import QueueEntry, admission_order


@dataclass(frozen=True)
class Scheduled:
    """What the scheduler was shown and decided in this pass."""

    views: tuple[JobView, ...]
    decision: Decision
    rates: forecast.Rates
    shared: bool  # two or more live jobs: the grants divide the spot GPUs
    on_demand: bool  # some job may use on-demand capacity, or some is held: its decisions are carried out
    owners: Mapping[str, str]  # node -> the job granted it (whole: the one granted most of it)

    def granted(self, job_id: str) -> frozenset[str]:
        return frozenset(node for node, job in self.owners.items() if job == job_id)

    def granted_to_others(self, job_id: str) -> frozenset[str]:
        return frozenset(node for node, job in self.owners.items() if job != job_id)


def on_demand_in_play(draft: Draft, live: list[JobRecord]) -> bool:
    allowed = any(j.spec.on_demand == "allowed" and j.spec.deadline for j in live)
    owned = any(n.pool is PoolKind.ON_DEMAND and n.state in PRESENT for n in draft.nodes.values())
    return allowed or owned or any(j.on_demand.gpus for j in draft.jobs.values())


def schedule(draft: Draft, config: Config, planners: Planners) -> Scheduled | None:
    """The pass's decision; None when one job at most is live and no on-demand capacity is in play."""
    live = [j for j in sorted(draft.jobs.values(), key=lambda j: j.id) if j.state in JOB_LIVE]
    shared, on_demand = len(live) >= 2, on_demand_in_play(draft, live)
    if not (shared or on_demand):
        return None
    views = tuple(v for j in live if (v := view(draft, config, planners, j)) is not None)
    rates = spot_rates(draft)
    decision = decide(views, scheduler_nodes(draft), rates, draft.now, config.scheduler)
    return Scheduled(views, decision, rates, shared, on_demand, owners(decision, draft))


def grants_now(world: World, now: float, config: Config, planners: Planners) -> Mapping[str, str] | None:
    """Each granted node's job as a pass would decide it now; None when the grants divide nothing (one live job at
    most: growth and admission follow the queue's order). For a free node's hint between passes."""
    scheduled = schedule(Draft(world, now), config, planners)
    return scheduled.owners if scheduled is not None and scheduled.shared else None


def owners(decision: Decision, draft: Draft) -> dict[str, str]:
    """Each granted node's job: the one granted most of its GPUs, then the one that holds it, then by name."""
    by_node: dict[str, list[tuple[int, bool, str]]] = {}
    for grant in decision.grants:
        holds = draft.nodes[grant.node].job == grant.job if grant.node in draft.nodes else False
        by_node.setdefault(grant.node, []).append((grant.gpus, holds, grant.job))
    return {node: min(claims, key=lambda c: (-c[0], not c[1], c[2]))[2] for node, claims in by_node.items()}


def shrink(draft: Draft, scheduled: Scheduled | None) -> None:
    """Running jobs the decision shrinks stop, to go on with the nodes granted to them (none: they queue)."""
    if scheduled is None or not scheduled.shared:
        return
    by_job: dict[str, list[Shrink]] = {}
    for cut in scheduled.decision.shrinks:
        by_job.setdefault(cut.job, []).append(cut)
    for job_id, cuts in sorted(by_job.items()):
        job = draft.jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING or job.action is not Action.RUN:
            continue  # a job already morphing is planned on what is granted to it once its stop ends
        keep = tuple(n for n in job.nodes if scheduled.owners.get(n) == job_id)
        if set(keep) == set(job.nodes):
            continue  # it keeps every node it holds (granted in part on nodes of several GPUs): nothing to free
        first, last = cuts[0], cuts[-1]
        detail = (
            f"shrunk from {first.from_gpus} to {last.to_gpus} spot GPU(s) for {last.for_job} ({last.cause}); "
            f"keeps {', '.join(keep) or 'no node'}"
        )
        # The nodes given up leave at the stop (``Assignment.leaving``): their ranks hand the layers only they hold
        # to ranks on the nodes kept, as on an eviction notice, so the next generation takes the whole step from
        # memory (a hand-off that fails writes it). Kept nowhere (it queues), the stop writes it: no step is lost.
        request = job.checkpoint_request + (0 if keep else 1)
        morph = replace(job.morph, keep_only=keep)
        draft.start_morph(job_id, Action.STOP, MorphCause.SHRUNK, detail, morph=morph, checkpoint_request=request)
        given = sorted(set(job.nodes) - set(keep))
        draft.event(JobShrunk(first.from_gpus, last.to_gpus, str(last.cause), last.for_job, given, list(keep)), job_id)


def admit_granted(draft: Draft, config: Config, planners: Planners, scheduled: Scheduled) -> dict[str, str]:
    """Queued jobs started on the nodes granted to them, once all are free; what each one left waits for."""
    waiting: dict[str, str] = {}
    if not draft.arrivals_settled(config.debounce_seconds):
        return waiting
    queued = [j for j in draft.jobs.values() if j.state is JobState.QUEUED]
    free = {n.name for n in free_nodes(draft.nodes)}
    for entry in admission_order([QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in queued]):
        granted = scheduled.granted(entry.job_id)
        if not granted:
            continue
        busy = sorted(granted - free)
        if busy:
            holders = sorted({h for n in busy if (h := draft.nodes[n].job) is not None})
            waiting[entry.job_id] = f"waits for {', '.join(busy)}, granted to it, to be freed" + (
                f" ({', '.join(holders)} shrinking for it)" if holders else ""
            )
            continue
        order = sorted(granted, key=lambda n: (draft.nodes[n].joined_at, n))
        plan = fit(draft, planners, entry.job_id, [(n, draft.nodes[n].slots) for n in order])
        if plan is None:
            continue
        _start(draft, config, entry.job_id, plan)
        free -= set(plan.layout.nodes())
    _admit_at_risk(draft, config, planners, scheduled, waiting)
    return waiting


def _admit_at_risk(
    draft: Draft, config: Config, planners: Planners, scheduled: Scheduled, waiting: Mapping[str, str]
) -> None:
    """Queued jobs granted nothing, in queue order, on free nodes at risk of eviction (which the scheduler is not
    shown: no job can rely on them) when a layout fits them: better than no GPUs, as with one job."""
    at_risk = [n for n in free_nodes(draft.nodes) if n.at_risk is not None and n.name not in scheduled.owners]
    queued = [j for j in draft.jobs.values() if j.state is JobState.QUEUED and j.id not in waiting]
    for entry in admission_order([QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in queued]):
        if not at_risk:
            return
        plan = fit(draft, planners, entry.job_id, [(n.name, n.slots) for n in at_risk])
        if plan is not None:
            _start(draft, config, entry.job_id, plan)
            at_risk = [n for n in at_risk if n.name not in plan.layout.nodes()]


def _start(draft: Draft, config: Config, job_id: str, plan: Plan) -> None:
    cause = MorphCause.RESUMED if draft.jobs[job_id].generation else MorphCause.ADMITTED
    start_generation(draft, config, job_id, plan, cause, str(cause))


def share_wait(config: Config) -> str:
    """Why a queued job the scheduler granted nothing waits, with the rule that ends the wait."""
    share = config.scheduler.share
    return (
        "waits for a share of the GPUs: the scheduler gives them where they add most samples/s, weighted by "
        f"priority (rising a level every {share.aging_seconds:g} s a job waits); after {share.starvation_seconds:g} s "
        "of waiting it is served first"
    )
