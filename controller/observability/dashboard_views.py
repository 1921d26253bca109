"""The dashboard's JSON, piece by piece: pure functions of the records and events the controller holds.

Everything here goes to a browser, where users and nodes wrote part of it (job names, reasons, event data):
numbers leave as finite floats or None, words as plain strings the page puts in as text, and an event's
detail is built here, bounded, from the fact its data decodes to (:mod:`controller.eventlog`), so the page never
walks a node's data itself and a field renamed by its writer is a decoding error here, not a blank picture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from controller.core.events import EventKind
from controller.core.records import JobRecord, NodeRecord
from controller.eventlog.fact import EventDataError, Fact
from controller.eventlog.facts import (
    EvaluationCompleted,
    GenerationIssued,
    StateChanged,
    TrainingProgressed,
)
from controller.eventlog.schema import decode
from controller.persistence.codec import EventRow, GenerationRow

F = TypeVar("F", bound=Fact)
Point = tuple[int, int, float | None]  # (the generation that reported it, step, value)
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


def curve(points: Iterable[Point], heard: Sequence[tuple[int, float]] = ()) -> list[list[float]]:
    """``[step, value]`` points of the events' ``(generation, step, value)`` (oldest first) and of what was
    ``heard`` since the controller started, in step order, each step once. A newer generation that resumed from an
    earlier step redoes the steps from there: the points it redoes are dropped, as the heard ones after it replace
    the events'."""
    kept: dict[int, float] = {}
    generation = 0
    for made_by, step, value in points:
        y = _number(value)
        if y is None:
            continue
        if made_by > generation:
            generation = made_by
            kept = {s: v for s, v in kept.items() if s < step}
        kept[step] = y
    if heard:
        kept = {s: v for s, v in kept.items() if s < heard[0][0]}
        kept.update(heard)
    return [[float(step), kept[step]] for step in sorted(kept)][-CURVE_POINTS:]


def facts_of(rows: Iterable[EventRow], cls: type[F]) -> list[F]:
    """The facts of class ``cls`` the rows hold; a row this version cannot read draws nothing (its detail says why)."""
    found = []
    for row in rows:
        with contextlib.suppress(EventDataError):
            fact = decode(row.kind, row.data)
            if isinstance(fact, cls):
                found.append(fact)
    return found


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
    spec = job.spec
    progressed = facts_of(events.get(EventKind.TRAINING_PROGRESSED, []), TrainingProgressed)
    evaluated = facts_of(events.get(EventKind.EVALUATION_COMPLETED, []), EvaluationCompleted)
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
        "last_checkpoint_step": job.last_checkpoint.step,
        "steps_lost": job.steps_lost,
        "morphs": [morph_view(g) for g in generations],
        "loss_curve": curve(((p.generation, p.step, p.loss) for p in progressed), heard),
        "eval_curve": curve((e.generation, e.step, e.loss) for e in evaluated),
        "rate_curve": curve(((p.generation, p.step, p.samples_per_second) for p in progressed), rates),
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


# The fields a fact says most with, in the order they are told, and how each is worded.
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
    {"source", "target", "action", "morph_cause", "resume_generation", "held_generation", "paused_since"}
    | {"resumed_at", "until", "lost_at", "not_before", *(name for name, _ in NAMED)}
)


def _plain(value: Any) -> bool:
    """A value worth a word: no nested structure (a node's GPUs, say), nothing empty."""
    if isinstance(value, list | tuple):
        return bool(value) and not any(isinstance(v, dict | list | tuple) for v in value)
    return value is not None and value != "" and not isinstance(value, dict)


def _told(fact: Fact) -> dict[str, Any]:
    """The fact's fields that say something: none left at its default (an older row's, or nothing to say)."""
    return {
        f.name: getattr(fact, f.name)
        for f in dataclasses.fields(fact)
        if not (f.default is not dataclasses.MISSING and getattr(fact, f.name) == f.default)
        and not (f.default_factory is not dataclasses.MISSING and getattr(fact, f.name) == f.default_factory())
    }


def event_detail(fact: Fact) -> str:
    """An event's fact as one short line of words (a state change first), at most DETAIL_CHARS."""
    fields, words = _told(fact), []
    if isinstance(fact, StateChanged):
        words.append(f"{_clean(fact.source)} -> {_clean(fact.target)}")
    for name, shape in NAMED:
        if fields.get(name) not in (None, "", []):
            words.append(shape.format(_clean(fields[name])))
    if isinstance(fact, GenerationIssued) and not fact.cause and fact.morph_cause:
        words.append(f"cause {_clean(fact.morph_cause)}")
    for name, value in fields.items():
        if name not in SKIPPED and _plain(value):
            words.append(f"{_clean(name)} {_clean(value)}")
        if sum(len(w) + 2 for w in words) > DETAIL_CHARS:
            break
    return _bounded(", ".join(words))


def _bounded(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


def event_view(row: EventRow) -> dict[str, Any]:
    """One row of the events list; a row this version cannot read says why in its detail."""
    try:
        fact = decode(row.kind, row.data)
    except EventDataError as exc:
        step, detail = None, _bounded(f"cannot read: {_clean(str(exc))}")
    else:
        step, detail = _step(getattr(fact, "step", None)), event_detail(fact)
    return {
        "seq": row.seq,
        "at": row.at,
        "kind": row.kind,
        "job": row.job,
        "node": row.node,
        "step": step,
        "checkpoint": row.kind in CHECKPOINT_KINDS,
        "detail": detail,
    }
