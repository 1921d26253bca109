"""Records to rows and back: how nodes, jobs, generations and events look in the state database."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Row

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.events import EventKind
from controller.core.lifecycle import JobState, NodeState, Transition
from controller.core.model import Action, Gpu, JobRecord, NodeRecord, Training
from morphing.jobspec import JobSpec
from morphing.layout import Layout


@dataclass(frozen=True)
class EventRow:
    seq: int
    at: float
    kind: str
    job: str | None
    node: str | None
    data: dict[str, Any]
    decision: int | None = None  # the decision that wrote it (None: written before decisions were numbered)


@dataclass(frozen=True)
class GenerationRow:
    job: str
    generation: int
    layout: dict[str, Any]
    resume_step: int
    cause: str  # in words (the API shows them)
    morph_seconds: float | None
    issued_at: float
    morph_cause: MorphCause  # the label metrics count by
    pause_seconds: float | None = None  # last step before the morph to the first after it (None: not yet)


def node_to_dict(node: NodeRecord) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, NodeState) else v) for k, v in asdict(node).items()}


def node_from_dict(data: dict[str, Any]) -> NodeRecord:
    """A node row's record; rows written before nodes reported GPUs have none (a CPU node)."""
    gpus = tuple(Gpu(**gpu) for gpu in data.get("gpus", ()))
    return NodeRecord(**{**data, "state": NodeState(data["state"]), "gpus": gpus})


def node_row(node: NodeRecord) -> dict[str, Any]:
    return {"name": node.name, "incarnation": node.incarnation, "state": str(node.state), "data": node_to_dict(node)}


def job_to_dict(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id,
        "spec": job.spec.model_dump(),
        "state": str(job.state),
        "submitted_at": job.submitted_at,
        "state_since": job.state_since,
        "generation": job.generation,
        "layout": job.layout.to_dict() if job.layout else None,
        "action": str(job.action),
        "rendezvous": job.rendezvous,
        "resume_step": job.resume_step,
        "resume_generation": job.resume_generation,
        "held_step": job.held_step,
        "held_generation": job.held_generation,
        "step": job.step,
        "last_checkpoint_step": job.last_checkpoint_step,
        "last_checkpoint_generation": job.last_checkpoint_generation,
        "steps_lost": job.steps_lost,
        "restarts": job.restarts,
        "checkpoint_request": job.checkpoint_request,
        "morph_started_at": job.morph_started_at,
        "morph_cause": str(job.morph_cause) if job.morph_cause is not None else None,
        "morph_detail": job.morph_detail,
        "reason": job.reason,
        "failure_cause": str(job.failure_cause) if job.failure_cause is not None else None,
        "excluded_nodes": list(job.excluded_nodes),
        "rendezvous_failures": [list(e) for e in job.rendezvous_failures],
        "excluded_until": [list(e) for e in job.excluded_until],
        "growth_declined": job.growth_declined,
        "idempotency_key": job.idempotency_key,
        "eval_step": job.eval_step,
        "eval_loss": job.eval_loss,
        "checkpoint_stall_seconds": job.checkpoint_stall_seconds,
        "checkpoint_stall_step": job.checkpoint_stall_step,
        "checkpoint_stall_generation": job.checkpoint_stall_generation,
        "last_step_at": job.last_step_at,
        "paused_since": job.paused_since,
        "decision_seconds": job.decision_seconds,
        "suspected": list(job.suspected),
        "salvage_step": job.salvage_step,
        "salvage_writers": list(job.salvage_writers),
        "salvage_deadline": job.salvage_deadline,
        "training": asdict(job.training),
    }


def job_from_dict(data: dict[str, Any]) -> JobRecord:
    fields = dict(data)
    fields["spec"] = JobSpec.model_validate(data["spec"])
    fields["state"] = JobState(data["state"])
    fields["action"] = Action(data["action"])
    fields["layout"] = Layout.from_dict(data["layout"]) if data["layout"] else None
    fields["morph_cause"] = MorphCause(data["morph_cause"]) if data["morph_cause"] else None
    cause = data.get("failure_cause")  # absent in rows written before failures had causes
    fields["failure_cause"] = JobFailureCause(cause) if cause else None
    fields["excluded_nodes"] = tuple(data.get("excluded_nodes", ()))  # absent in rows written before it existed
    fields["growth_declined"] = data.get("growth_declined", "")
    failures = data.get("rendezvous_failures", ())  # absent in rows written before reconcile.unreachable
    fields["rendezvous_failures"] = tuple((str(n), str(h), float(t)) for n, h, t in failures)
    fields["excluded_until"] = tuple((str(n), float(t)) for n, t in data.get("excluded_until", ()))
    # Rows written before checkpoints were named by generation: their checkpoints are named by step alone,
    # which generation 0 names (step-NNNNNNNN).
    fields["resume_generation"] = data.get("resume_generation", 0)
    fields["held_step"] = data.get("held_step", 0)  # absent in rows written before morphs through memory
    fields["held_generation"] = data.get("held_generation", 0)
    fields["last_checkpoint_generation"] = data.get("last_checkpoint_generation", 0)
    fields["suspected"] = tuple(data.get("suspected", ()))  # absent in rows written before unplanned-loss salvage
    fields["salvage_writers"] = tuple(data.get("salvage_writers", ()))
    fields["training"] = Training(**data.get("training", {}))  # absent in rows written before losses were kept
    return JobRecord(**fields)


def generation_from_row(row: Row[Any]) -> GenerationRow:
    r, cause = row, MorphCause(row.morph_cause)
    return GenerationRow(
        r.job, r.generation, r.layout, r.resume_step, r.cause, r.morph_seconds, r.issued_at, cause, r.pause_seconds
    )


def event_from_row(row: Row[Any]) -> EventRow:
    return EventRow(row.seq, row.at, row.kind, row.job, row.node, row.data, row.decision)


def change_data(change: Transition) -> dict[str, Any]:
    """A state change as the data of its ``NodeStateChanged`` / ``JobStateChanged`` event."""
    return {"from": change.source, "to": change.target, "cause": change.cause, "reason": change.reason}


def event_row(at: float, kind: EventKind, job: str | None, node: str | None, data: dict[str, Any]) -> dict[str, Any]:
    """An ``events`` row; ``data`` goes through JSON so it holds what reading it back gives."""
    return {"at": at, "kind": str(kind), "job": job, "node": node, "data": json.loads(json.dumps(data))}
