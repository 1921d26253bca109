"""Running jobs take free nodes (with several jobs live: free nodes the scheduler granted no other job,
:mod:`~controller.core.reconcile.sharing`), if the policy says the morph pays off; never a node at risk of eviction
(:mod:`~controller.core.reconcile.risk`).

When it does not, one ``GrowthDeclined`` event per generation and set of free nodes says why, with the
numbers the policy weighed, so an operator who sees idle nodes beside a running job can tell. Before it
does, :func:`growth_hint` tells a free node which job it would most likely take, so its warm trainers build
that job's model ahead and the growth's pause does not hold the build; and a growth waits while such a node
reports that build under way (:func:`building_ahead`), up to ``warm_build_wait_seconds`` after it joined: a
model that takes longer to build than the debounce (any large one) would otherwise be built inside the pause.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from controller.core.causes import MorphCause
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import Action, JobRecord, NodeRecord, World
from controller.core.observations import NodeObservation
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.devices import may_run_on, spec_on
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import planned, steadier
from controller.core.reconcile.learn import correction, growth_allowed
from controller.core.reconcile.sharing import Scheduled
from controller.core.reconcile.unreachable import held_out
from controller.eventlog import facts
from morphing.jobspec import JobSpec
from morphing.planner import Plan, Planner
from morphing.policy import decide_morph


def growing(jobs: Iterable[JobRecord]) -> list[JobRecord]:
    """The running jobs in the order growth offers them free nodes."""
    running = (j for j in jobs if j.state is JobState.RUNNING and j.layout is not None)
    return sorted(running, key=lambda j: (-j.spec.priority, j.submitted_at, j.id))


def growth_hint(
    world: World, name: str, now: float, grants: Mapping[str, str] | None = None
) -> tuple[str, JobSpec] | None:
    """The job most likely to be placed on the free node ``name`` next, and the spec its trainers would be given
    there; None unless that job trains on the CPU (only a CPU model is kept by a warm trainer,
    :mod:`worker_agent.runtime.process.warm_model`). A hint for the node's warm trainers, never a decision.

    ``grants``: each granted node's job while the scheduler shares the GPUs
    (:func:`~controller.core.reconcile.sharing.grants_now`): a node granted to a job goes to it alone (a running
    job's growth, or a queued job's admission), one granted to none to the first job growth offers it."""
    node = world.nodes.get(name)
    if node is None or node.state is not NodeState.READY or node.job is not None or node.at_risk is not None:
        return None  # a node at risk is grown onto by no job
    owner = (grants or {}).get(name)
    candidates = growing(world.jobs.values()) if owner is None or owner not in world.jobs else [world.jobs[owner]]
    for job in candidates:
        queued = job.state is JobState.QUEUED and owner == job.id
        if not (queued or job.action is Action.RUN) or held_out(job, name, now) or not may_run_on(job, node):
            continue
        spec = spec_on(job.spec, [*(world.nodes.get(n) for n in job.nodes), node])
        return (job.id, spec) if spec.device == "cpu" else None
    return None


SETTLE_GRACE_SECONDS = 3.0  # past the debounce window: the reconcile that decides, and the old generation's stop


def building_ahead(
    observed: Mapping[str, NodeObservation], node: NodeRecord, job_id: str | None, now: float, wait_seconds: float
) -> bool:
    """The node's warm trainer reports building ``job_id``'s model ahead (any job's, for None), and the node
    joined less than ``wait_seconds`` ago: a growth onto it waits for the build rather than pause for it."""
    seen = observed.get(node.name)
    if seen is None or not seen.building or (job_id is not None and seen.building != job_id):
        return False
    return now - node.joined_at < wait_seconds


def assignment_soon(world: World, name: str, now: float, config: Config, hinted: bool) -> bool:
    """Whether the free node ``name`` may be given work within seconds: a job is morphing (its next generation
    may take free nodes), or a growth onto it may be decided once the newest arrivals have settled or its warm
    build is done (``hinted``: :func:`growth_hint` names a job for it). Such a node is told to beat often, as a
    morphing node's agent does: its assignment reaches it only in a heartbeat reply, and its build's end only
    in a heartbeat."""
    node = world.nodes.get(name)
    if node is None or node.state is not NodeState.READY or node.job is not None:
        return False
    if any(j.state is JobState.MORPHING for j in world.jobs.values()):
        return True
    newest = max(n.joined_at for n in world.nodes.values() if n.state is NodeState.READY and n.job is None)
    settling = now - newest < config.debounce_seconds + SETTLE_GRACE_SECONDS
    return hinted and (settling or building_ahead(world.observed, node, None, now, config.warm_build_wait_seconds))


def grow(draft: Draft, config: Config, planners: Planners, scheduled: Scheduled | None = None) -> None:
    """Running jobs, in :func:`growing`'s order, take free nodes where the morph pays; while the scheduler shares
    the GPUs (``scheduled.shared``), never a node it granted another job."""
    if not draft.arrivals_settled(config.debounce_seconds):
        return
    claimed = draft.claimed  # free nodes a job higher in the order grows (or moves) onto in this pass
    for job in growing(draft.jobs.values()):
        others = scheduled.granted_to_others(job.id) if scheduled is not None and scheduled.shared else frozenset()
        free = [n for n in free_nodes(draft.nodes) if n.name not in claimed | others and n.at_risk is None]
        planner = planners.get(job.id)
        if not free or not isinstance(planner, Planner) or job.layout is None:
            continue
        usable = [(n.name, n.slots) for n in free if not held_out(job, n.name, draft.now) and may_run_on(job, n)]
        if not usable:
            continue
        if any(
            building_ahead(draft.observed, draft.nodes[n], job.id, draft.now, config.warm_build_wait_seconds)
            for n, _ in usable
        ):
            return  # its model is being built on a node it may take: no job takes the free nodes meanwhile
        current = planned(draft, job.id, planner.evaluate, job.layout)
        held = [(n, draft.nodes[n].slots) for n in job.nodes]
        candidate = planned(draft, job.id, planner.plan, held + usable)
        if job.id in draft.unplannable:
            continue
        if isinstance(candidate, Plan):  # what it would run there: the fastest, or the layout of better liveput
            candidate = steadier(draft, planner, job.id, held + usable, candidate)
        predicted = current.samples_per_second if isinstance(current, Plan) else None
        rate, scale = measured_rate(job, draft.now, predicted)
        remaining = max(0, job.spec.steps - job.step) * job.spec.global_batch / rate if rate else None
        candidate_rate = candidate.samples_per_second * scale if isinstance(candidate, Plan) else None
        if isinstance(candidate, Plan) and candidate_rate is not None:
            if not growth_allowed(job, sorted(set(candidate.layout.nodes()) - set(job.nodes))):
                continue  # that growth was undone before (it measured slower): never retried
            if isinstance(current, Plan):  # the scaling the job measured (reconcile.learn), not the profile's alone
                candidate_rate *= correction(job, current.gpus_used, candidate.gpus_used)
        decision = decide_morph(
            current_samples_per_second=rate,
            current_layout_intact=True,
            candidate_samples_per_second=candidate_rate,
            morph_cost_seconds=config.morph_cost_seconds,
            config=config.policy,
            remaining_seconds=remaining,
        )
        if decision.morph:
            judged = replace(job.learning, growth_from=rate, grown_from=job.nodes)  # reconcile.learn judges it
            draft.start_morph(job.id, Action.STOP, MorphCause.GROW, f"grow: {decision.detail}", learning=judged)
            claimed.update(name for name, _ in usable)  # a lower job stopping for the same nodes would only restart
            continue
        offer = f"{job.generation}:{','.join(sorted(name for name, _ in usable))}"
        if offer != job.growth_declined:
            draft.amend_job(job.id, growth_declined=offer)
            declined = facts.GrowthDeclined(
                generation=job.generation,
                free_nodes=[name for name, _ in usable],
                reason=str(decision.reason),
                detail=decision.detail,
                samples_per_second=rate,
                candidate_samples_per_second=candidate_rate,
                remaining_seconds=remaining,
                morph_cost_seconds=config.morph_cost_seconds,
            )
            draft.event(declined, job.id)


def measured_rate(job: JobRecord, now: float, predicted: float | None) -> tuple[float | None, float]:
    """The job's samples/s as measured in its current generation, and measured / predicted.

    Profiles calibrated on one device can be far off on a busy host; the ratio of two predictions is
    more trustworthy than either, so the candidate is scaled by how far the current one was off.
    """
    elapsed = now - job.state_since
    done = job.step - job.resume.step
    if predicted is None or done <= 0 or elapsed <= 0:
        return predicted, 1.0
    measured = done * job.spec.global_batch / elapsed
    return measured, measured / predicted
