"""Fitting a job onto nodes and issuing its next generation: shared by the morph protocol and admission."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.commands import StartGeneration
from controller.core.lifecycle import JOB_TERMINAL, JobState, NodeState
from controller.core.reconcile.config import Config, Planners
from controller.core.reconcile.devices import may_run_on
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.unreachable import held_out
from controller.core.reconcile.views import spot_rates
from controller.core.records import CheckpointRef, JobRecord
from morphing.planner import Plan, Planner, PlanResult
from scheduler.layouts import LossCosts, steadiest


def planned(draft: Draft, job_id: str, ask: Callable[..., PlanResult], *args: Any) -> PlanResult | None:
    """``ask(*args)``, a planner's answer; ``None`` when it raised, and the job is marked to fail with why.

    A planner works on the job's own profile: one it cannot plan with fails that job, never the
    decisions for every other job.
    """
    if job_id in draft.unplannable:
        return None
    try:
        return ask(*args)
    except Exception as exc:
        draft.unplannable[job_id] = f"planning failed ({type(exc).__name__}: {str(exc)[:200]}); check its profile"
        return None


def fail_unplannable(draft: Draft) -> None:
    """Jobs whose planner failed during this pass fail, and let go of their nodes."""
    for job_id, reason in sorted(draft.unplannable.items()):
        job = draft.jobs[job_id]
        if job.state not in JOB_TERMINAL:
            draft.move_job(job_id, JobState.FAILED, reason, failure_cause=JobFailureCause.UNPLANNABLE)
            draft.release_nodes(job_id, job.nodes, "job failed")


def rendezvous_port(config: Config, job_id: str, generation: int, previous: str = "") -> int:
    """Generation ``generation``'s rendezvous port: another for every generation (one whose port was taken ends,
    and the next meets elsewhere), and with the controller's salt one nobody else can tell in advance. Never the
    port of ``previous`` (the generation before's rendezvous, ``HOST:PORT``): its survivors may still hold their
    store there (held for a salvage, or stopping) when this generation's rank 0 listens."""
    base, span = config.rendezvous_port_base, config.rendezvous_port_span
    if not config.rendezvous_salt:
        port = base + (zlib.crc32(job_id.encode()) + generation) % span
    else:
        digest = hashlib.sha256(f"{config.rendezvous_salt}\0{job_id}\0{generation}".encode()).digest()
        port = base + int.from_bytes(digest[:8], "big") % span
    _, _, before = previous.rpartition(":")
    return base + (port - base + 1) % span if before == str(port) else port


def usable_nodes(draft: Draft, job: JobRecord, nodes: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """``nodes`` the job may be placed on: not held out for it, and of a device it can use."""
    return [
        (name, slots)
        for name, slots in nodes
        if not held_out(job, name, draft.now) and may_run_on(job, draft.nodes[name])
    ]


def fit(
    draft: Draft, planners: Planners, job_id: str, nodes: Sequence[tuple[str, int]], least_gpus: int = 1
) -> Plan | None:
    """The best plan for the job on ``nodes`` (less the ones it excluded or whose devices it cannot use) using
    at least ``least_gpus`` of them, or ``None`` if none runs it: the planner's fastest, unless another pipeline
    depth expects more over the next half hour at the spot pool's eviction rate (its liveput,
    :func:`scheduler.layouts.steadiest`: say a layout whose likely loss keeps its stage partition)."""
    planner = planners.get(job_id)
    job = draft.jobs[job_id]
    usable = usable_nodes(draft, job, nodes)
    if not isinstance(planner, Planner) or not usable:
        return None
    result = planned(draft, job_id, planner.plan, usable, None, least_gpus)
    if not isinstance(result, Plan) or result.gpus_used < job.spec.min_gpus:
        return None
    steady = steadier(draft, planner, job_id, usable, result, least_gpus)
    return steady if steady.gpus_used >= job.spec.min_gpus else result


def steadier(
    draft: Draft, planner: Planner, job_id: str, nodes: Sequence[tuple[str, int]], fastest: Plan, least_gpus: int = 1
) -> Plan:
    """``fastest`` on ``nodes``, or the layout of better liveput at the spot pool's eviction rate
    (:func:`scheduler.layouts.steadiest`; a growth weighs the same candidate admission would run)."""
    rates = spot_rates(draft)
    steady = planned(draft, job_id, steadiest, planner, nodes, fastest, rates, LossCosts(), 1800.0, least_gpus)
    return steady if isinstance(steady, Plan) else fastest


def held_for_next(job: JobRecord, stopped: bool) -> CheckpointRef:
    """The step g+1 is told to take from its trainers' memory (none: it loads the committed checkpoint).

    After a planned stop (``stopped``), the step g stopped at, or the step its survivors keep after an unplanned
    loss (``salvage.step``). After g ended otherwise before it trained past the step it was named (its rendezvous or
    exchange failed, a rank could not start, a node was lost meanwhile): that step again, held by the same
    generation, since g's processes hold it again until they have loaded it
    (:meth:`worker_agent.runtime.process.trainer_process.TrainerProcess.next_generation`); g+1 says so if they
    do not (``HeldStateSkipped``), and the steps are counted lost then."""
    if not job.spec.morph_through_memory or not job.generation:
        return CheckpointRef()
    if stopped:
        at = job.salvage.step or job.step
        return CheckpointRef(at, job.generation) if at > 0 else CheckpointRef()
    # Only while the job morphs: a job that queued meanwhile let its nodes go, and their holders with them.
    if job.state is JobState.MORPHING and job.held.step > job.last_checkpoint.step and job.step == job.held.step:
        return job.held
    return CheckpointRef()


def start_generation(
    draft: Draft, config: Config, job_id: str, plan: Plan, cause: MorphCause, detail: str, stopped: bool = False
) -> None:
    """Issue generation g+1 on the plan's nodes, resuming from the newest committed checkpoint: exactly that one
    (its step and the generation that committed it), never whatever else an older generation left on disk.

    ``stopped``: generation g ended in a planned stop at the job's step (or, after an unplanned loss, at the step
    its survivors keep, ``hold.step``), which its trainers keep in memory; g+1 is told to take that step
    from them (``held``), the committed checkpoint being what it loads without."""
    job = draft.jobs[job_id]
    generation = job.generation + 1
    layout = plan.layout
    detail = "; ".join([detail, *(note for note in plan.notes if note.startswith("liveput:"))])  # why not the fastest
    rank0 = draft.nodes[layout.placement[0].node]
    port = rendezvous_port(config, job_id, generation, job.rendezvous)
    resume = job.last_checkpoint
    held = held_for_next(job, stopped)
    lost = max(0, job.step - max(resume.step, held.step)) if job.generation else 0
    seconds = draft.now - job.morph.started_at if job.morph.started_at is not None else None
    draft.issue(
        StartGeneration(
            job_id,
            generation,
            layout,
            resume,
            cause,
            detail,
            seconds,
            draft.now,
            held,
        )
    )
    draft.move_job(
        job_id,
        JobState.RUNNING,
        f"generation {generation}: {layout.describe()} ({detail})",
        generation=generation,
        layout=layout,
        rendezvous=f"{rank0.address}:{port}",
        resume=resume,
        held=held,
        step=max(resume.step, held.step),
        steps_lost=job.steps_lost + lost,
        # the pause runs from the job's last step (a generation that never stepped carries it on)
        morph=replace(
            job.morph,
            paused_since=job.morph.paused_since if job.morph.paused_since is not None else job.last_step_at,
            decision_seconds=seconds,
            keep_only=None,
        ),
    )
    for name in layout.nodes():
        draft.move_node(name, NodeState.ASSIGNED, f"generation {generation} of {job_id}", job=job_id)
