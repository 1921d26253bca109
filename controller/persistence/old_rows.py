"""What rows of older schema versions hold, and the pure changes that bring each to the next version.

The migrations (:mod:`controller.persistence.schema`) read and write the rows; what a row of an older version
lacks, and how its fields were named, lives here, without I/O, so the migrations and their tests share it.
"""

from __future__ import annotations

from typing import Any

from controller.core.causes import MorphCause

# How morph causes were told apart while they were stored as words only (first match wins).
LEGACY_CAUSE_WORDS = (
    ("eviction", MorphCause.EVICTION),
    ("node lost", MorphCause.NODE_LOST),
    ("could not start", MorphCause.TRAINER_START_FAILED),
    ("failed", MorphCause.TRAINER_FAILED),
    ("grow", MorphCause.GROW),
    ("admitted", MorphCause.ADMITTED),
    ("resumed", MorphCause.RESUMED),
)


def legacy_morph_cause(detail: str) -> MorphCause:
    """The cause of a morph stored before causes were, read from its words as metrics used to."""
    lowered = detail.lower()
    return next((cause for words, cause in LEGACY_CAUSE_WORDS if words in lowered), MorphCause.OTHER)


# Each job field a row may lack, with the value it had before the field existed (fields grew without schema
# versions until 9, the codec filling them in): _v9 writes them into every row, and the codec reads rows
# strictly from then on. A field added later gets a migration of its own.
JOB_FIELDS_BEFORE: dict[str, Any] = {
    "generation": 0, "layout": None, "action": "RUN", "rendezvous": "", "resume_step": 0, "resume_generation": 0,
    "held_step": 0, "held_generation": 0, "step": 0, "last_checkpoint_step": 0, "last_checkpoint_generation": 0,
    "steps_lost": 0, "restarts": 0, "checkpoint_request": 0, "morph_started_at": None, "morph_cause": None,
    "morph_detail": "", "reason": "", "failure_cause": None, "excluded_nodes": [], "rendezvous_failures": [],
    "excluded_until": [], "growth_declined": "", "idempotency_key": None, "eval_step": 0, "eval_loss": None,
    "checkpoint_stall_seconds": None, "checkpoint_stall_step": 0, "checkpoint_stall_generation": 0,
    "last_step_at": None, "paused_since": None, "decision_seconds": None, "suspected": [], "salvage_step": 0,
    "salvage_writers": [], "salvage_deadline": 0.0, "training": {},
}  # fmt: skip
TRAINING_FIELDS_BEFORE: dict[str, Any] = {
    "loss": None, "step": 0, "samples_per_second": None, "reported_at": None, "generation": 0,
}  # fmt: skip


def complete_job_row(data: dict[str, Any]) -> dict[str, Any]:
    """A job row as version 9 writes it: absent fields as they were before they existed; an empty cause is none."""
    row = {**JOB_FIELDS_BEFORE, **data}
    row["training"] = {**TRAINING_FIELDS_BEFORE, **(row["training"] or {})}
    for key in ("morph_cause", "failure_cause"):
        row[key] = row[key] or None  # rows once stored "" for no cause
    return row


NODE_FIELDS_BEFORE: dict[str, Any] = {
    "job": None, "eviction_not_before": None, "gpus": [], "instance": "", "lost_at": None, "flaps": 0,
    "flapped_at": None, "held_until": None,
}  # fmt: skip


def complete_node_row(data: dict[str, Any]) -> dict[str, Any]:
    """A node row as version 9 writes it (a node registered before nodes reported GPUs has none: a CPU node)."""
    return {**NODE_FIELDS_BEFORE, **data}


# Version 10 groups a job's flat fields into the records they belong to: new name -> {its field: the old one}.
NESTED_JOB_FIELDS: dict[str, dict[str, str]] = {
    "morph": {
        "started_at": "morph_started_at", "cause": "morph_cause", "detail": "morph_detail",
        "paused_since": "paused_since", "decision_seconds": "decision_seconds",
    },
    "exclusions": {"nodes": "excluded_nodes", "rendezvous_failures": "rendezvous_failures", "until": "excluded_until"},
    "hold": {"suspected": "suspected", "step": "salvage_step", "writers": "salvage_writers",
             "deadline": "salvage_deadline"},
    "evaluation": {"step": "eval_step", "loss": "eval_loss"},
    "checkpoint_stall": {
        "seconds": "checkpoint_stall_seconds", "step": "checkpoint_stall_step",
        "generation": "checkpoint_stall_generation",
    },
}  # fmt: skip


def nest_job_row(row: dict[str, Any], records: dict[str, dict[str, str]] = NESTED_JOB_FIELDS) -> dict[str, Any]:
    """A version 9 job row as version 10 stores it (or ``records`` of a later one); a row nested is left as is."""
    nested = dict(row)
    for name, fields in records.items():
        if name not in nested:
            # a field a (damaged) row lacks stays absent: the codec then refuses the row, naming it
            nested[name] = {field: nested.pop(old) for field, old in fields.items() if old in nested}
    return nested


# Version 12's node fields, as rows older than them have them: none suspected, the name never taken over.
NODE_FIELDS_V12: dict[str, Any] = {"suspected_at": None, "name_taken_at": None}
# Version 18's: no eviction risk known (agents report a risk with every heartbeat, so it comes back if it holds).
NODE_FIELDS_V18: dict[str, Any] = {"at_risk": None}
NODE_FIELDS_V19: dict[str, Any] = {"pool": "spot", "owner": None}  # every node was spot before pools were kept
JOB_FIELDS_V19: dict[str, Any] = {
    "on_demand": {
        "gpus": 0,
        "cause": None,
        "since": None,
        "deadline_in_seconds": None,
        "remaining_samples": 0.0,
        "spot_gpus": 0,
        "spot_samples_per_second": 0.0,
        "with_on_demand_samples_per_second": 0.0,
        "finish_seconds": None,
    },
    "learning": {
        "observations": [],
        "checked_generation": 0,
        "error_before": None,
        "error_after": None,
        "growth_from": None,
        "grown_from": [],
        "avoid": [],
    },
}
JOB_FIELDS_V20: dict[str, Any] = {"queued_since": None, "running_since": None}  # None: counted from state_since


def with_keep_only(row: dict[str, Any]) -> dict[str, Any]:
    """Schema 21: a job row's morph gains ``keep_only`` (None: no shrink under way), its on-demand hold
    ``returned_gpu_seconds`` (0: none given back); a part that is no object is left for its reader to refuse,
    naming it."""
    out = dict(row)
    morph, hold = row.get("morph"), row.get("on_demand")
    if isinstance(morph, dict):
        out["morph"] = {"keep_only": None, **morph}
    if isinstance(hold, dict):
        out["on_demand"] = {"returned_gpu_seconds": 0.0, **hold}
    return out


def renamed(row: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """``row`` with its key ``old`` named ``new`` (schema 16's renames); a row that has ``new`` keeps that value."""
    out = dict(row)
    if old in out:
        value = out.pop(old)
        out.setdefault(new, value)
    return out
