"""The dashboard's JSON, piece by piece: pure functions of the records and events the controller holds.

Everything here goes to a browser, where users and nodes wrote part of it (job names, reasons, event data):
numbers leave as finite floats or None, words as plain strings the page puts in as text, and an event's
detail is built here, bounded, from the keys it knows, so the page never walks a node's data itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller.core.events import EventKind
from controller.core.records import JobRecord, NodeRecord
from controller.persistence.codec import EventRow, GenerationRow

CURVE_POINTS = 1000  # the newest points of each curve (events of the store, and values heard since the start)
DETAIL_CHARS = 160  # an event's detail, at most
WORD_CHARS = 80  # one value of it, at most
# Written at every checkpoint of every job (most of the log): the page folds runs of them into one row.
CHECKPOINT_KINDS = frozenset({EventKind.CHECKPOINT_COMMITTED, EventKind.CHECKPOINT_STALL_MEASURED})


def _number(value: Any) -> float | None:
    """A finite float, or None (what JSON can carry and the page can plot)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def node_view(node: NodeRecord) -> dict[str, Any]:
    return {
        "name": node.name,
        "state": str(node.state),
        "slots": node.slots,
        "job": node.job,
        "incarnation": node.incarnation,
        "gpus": [{"index": g.index, "name": g.name, "memory_gib": round(g.memory_bytes / 2**30, 1)} for g in node.gpus],
    }


def layout_view(job: JobRecord) -> dict[str, Any] | None:
    layout = job.layout
    if layout is None:
        return None
    return {
        "stages": layout.pipeline_stages,
        "replicas": layout.data_parallel,
        "micro_batch_size": layout.micro_batch_size,
        "micro_batches": layout.max_micro_batches,
        "stage_layers": [list(span) for span in layout.stage_layers],
        "placement": [
            {"rank": rank, "node": slot.node, "slot": slot.slot} for rank, slot in enumerate(layout.placement)
        ],
    }


def curve(rows: Iterable[EventRow], value: str, heard: Sequence[tuple[int, float]] = ()) -> list[list[float]]:
    """``[step, value]`` points of the events' data (oldest first) and of what was ``heard`` since the controller
    started, in step order, each step once. A newer generation that resumed from an earlier step redoes the
    steps from there: the points it redoes are dropped, as the heard ones after it replace the events'."""
    points: dict[int, float] = {}
    generation = 0
    for row in rows:
        step, y, made_by = _step(row.data.get("step")), _number(row.data.get(value)), row.data.get("generation")
        if step is None or y is None:
            continue
        if isinstance(made_by, int) and made_by > generation:
            generation = made_by
            points = {s: v for s, v in points.items() if s < step}
        points[step] = y
    if heard:
        points = {s: v for s, v in points.items() if s < heard[0][0]}
        points.update(heard)
    return [[float(step), points[step]] for step in sorted(points)][-CURVE_POINTS:]


def morph_view(g: GenerationRow) -> dict[str, Any]:
    return {
        "generation": g.generation,
        "issued_at": g.issued_at,
        "cause": str(g.morph_cause),
        "detail": g.cause,
        "resume_step": g.resume_step,
        "resumed_at_step": g.resumed_at_step,  # the memory it took, or its checkpoint: as status and TensorBoard
        "shape": f"{g.layout.get('pipeline_stages', '?')}x{g.layout.get('data_parallel', '?')}",
        "pause_seconds": _number(g.pause_seconds),
        "stalled_seconds": _number(g.stalled_seconds),
    }


def job_view(
    job: JobRecord,
    generations: Iterable[GenerationRow],
    events: Mapping[str, list[EventRow]],
    heard: Sequence[tuple[int, float]] = (),
    rates: Sequence[tuple[int, float]] = (),
) -> dict[str, Any]:
    """One job as the page draws it; ``events`` by kind (its ``TrainingProgressed`` and
    ``EvaluationCompleted``), ``heard`` and ``rates`` the losses and samples/s heard since the start."""
    spec, progressed = job.spec, events.get(EventKind.TRAINING_PROGRESSED, [])
    return {
        "id": job.id,
        "name": spec.name,
        "state": str(job.state),
        "reason": job.reason,
        "step": job.step,
        "steps": spec.steps,
        "generation": job.generation,
        "layout": layout_view(job),
        "loss": _number(job.training.loss),
        "samples_per_second": _number(job.training.samples_per_second),
        "eval_loss": _number(job.evaluation.loss),
        "last_checkpoint_step": job.last_checkpoint_step,
        "steps_lost": job.steps_lost,
        "morphs": [morph_view(g) for g in generations],
        "loss_curve": curve(progressed, "loss", heard),
        "eval_curve": curve(events.get(EventKind.EVALUATION_COMPLETED, []), "loss"),
        "rate_curve": curve(progressed, "samples_per_second", rates),
    }


def _clean(value: Any) -> str:
    """One value as short words: numbers short, lists joined, control characters out, at most WORD_CHARS."""
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, list | tuple):
        text = ", ".join(_clean(v) for v in value[:8]) + (", ..." if len(value) > 8 else "")
    else:
        text = str(value)
    text = "".join(c if c.isprintable() else " " for c in text[: WORD_CHARS * 2])
    return text if len(text) <= WORD_CHARS else text[: WORD_CHARS - 3] + "..."


# The keys an event's data says most with, in the order they are told, and how each is worded.
NAMED = (
    ("generation", "generation {}"),
    ("step", "step {}"),
    ("resume_step", "resume step {}"),
    ("held_step", "held step {}"),
    ("layout", "layout {}"),
    ("cause", "cause {}"),
    ("reason", "{}"),
    ("why", "{}"),
    ("error", "error {}"),
    ("message", "{}"),
    ("loss", "loss {}"),
    ("samples_per_second", "{} samples/s"),
    ("stall_seconds", "stalled {} s"),
    ("pause_seconds", "paused {} s"),
    ("stalled_seconds", "stalled {} s"),
    ("decision_seconds", "decided in {} s"),
    ("nodes", "nodes {}"),
)
# Said otherwise (a state change, the cause), or times the row already has: left out of the rest.
SKIPPED = frozenset(
    {"from", "to", "morph_cause", "detail", "resume_generation", "held_generation", "paused_since", "resumed_at"}
    | {"until", "lost_at", "not_before", *(key for key, _ in NAMED)}
)


def _plain(value: Any) -> bool:
    """A value worth a word: no nested structure (a node's GPUs, say), nothing empty."""
    if isinstance(value, list | tuple):
        return bool(value) and not any(isinstance(v, dict | list | tuple) for v in value)
    return value is not None and value != "" and not isinstance(value, dict)


def event_detail(data: Mapping[str, Any]) -> str:
    """An event's data as one short line of words (a state change first), at most DETAIL_CHARS."""
    words = []
    if "to" in data:
        words.append(f"{_clean(data.get('from', '?'))} -> {_clean(data['to'])}")
    for key, shape in NAMED:
        if data.get(key) not in (None, "", []):
            words.append(shape.format(_clean(data[key])))
    if "cause" not in data and data.get("morph_cause"):
        words.append(f"cause {_clean(data['morph_cause'])}")
    for key, value in data.items():
        if key not in SKIPPED and _plain(value):
            words.append(f"{_clean(key)} {_clean(value)}")
        if sum(len(w) + 2 for w in words) > DETAIL_CHARS:
            break
    text = ", ".join(words)
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


def event_view(row: EventRow) -> dict[str, Any]:
    data = row.data if isinstance(row.data, dict) else {}
    return {
        "seq": row.seq,
        "at": row.at,
        "kind": row.kind,
        "job": row.job,
        "node": row.node,
        "step": _step(data.get("step")),
        "checkpoint": row.kind in CHECKPOINT_KINDS,
        "detail": event_detail(data),
    }
