"""The web dashboard: one read-only page served beside ``/metrics``, and the JSON it draws.

No build step and nothing fetched from elsewhere: the page (``dashboard.html`` beside this module) is one
HTML file with its script and style inline; it puts every string from the controller in as text
(``textContent``), never as HTML, since job reasons and event text come from users and nodes. It asks
``GET /api/v1/dashboard`` every few seconds with a token (typed once into the page, or given in the
address's fragment ``#token=...``, which browsers never send to a server) and draws the nodes with their
GPUs, the jobs with their layouts, each job's morph timeline, its loss and eval-loss curves and the newest
events. The JSON comes from the state view the status RPCs read, behind the same tokens (operator or
reader); the controller serves it over TLS, or on loopback only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from importlib.resources import files
from typing import Any

from aiohttp import web

from controller.core.lifecycle import JOB_TERMINAL
from controller.core.records import JobRecord, NodeRecord
from controller.observability.curves import LossCurves
from controller.persistence.codec import EventRow, GenerationRow
from controller.shell.views import StateView
from controller.tokens import Role, Tokens

API_PATH = "/api/v1/dashboard"
HTML = files("controller.observability").joinpath("dashboard.html").read_text(encoding="utf-8")
CURVE_POINTS = 1000  # the newest points of each curve (events of the store, and losses heard since the start)
EVENTS_SHOWN = 40  # the newest events listed
READERS = frozenset({Role.OPERATOR, Role.READER})
NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
# The page's own script and style, and requests to this origin; nothing else (no frames, no other hosts).
PAGE_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def _number(value: Any) -> float | None:
    """A finite float, or None (what JSON can carry and the page can plot)."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


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
        step, y, made_by = row.data.get("step"), _number(row.data.get(value)), row.data.get("generation")
        if not isinstance(step, int) or y is None:
            continue
        if isinstance(made_by, int) and made_by > generation:
            generation = made_by
            points = {s: v for s, v in points.items() if s < step}
        points[step] = y
    if heard:
        points = {s: v for s, v in points.items() if s < heard[0][0]}
        points.update(heard)
    return [[float(step), points[step]] for step in sorted(points)][-CURVE_POINTS:]


def job_view(
    job: JobRecord,
    generations: Iterable[GenerationRow],
    events: Mapping[str, list[EventRow]],
    heard: Sequence[tuple[int, float]] = (),
) -> dict[str, Any]:
    spec = job.spec
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
        "morphs": [
            {
                "generation": g.generation,
                "issued_at": g.issued_at,
                "cause": str(g.morph_cause),
                "detail": g.cause,
                "resume_step": g.resume_step,
                "shape": f"{g.layout.get('pipeline_stages', '?')}x{g.layout.get('data_parallel', '?')}",
                "pause_seconds": _number(g.pause_seconds),
                "stalled_seconds": _number(g.stalled_seconds),
            }
            for g in generations
        ],
        "loss_curve": curve(events.get("TrainingProgressed", []), "loss", heard),
        "eval_curve": curve(events.get("EvaluationCompleted", []), "loss"),
    }


def event_view(row: EventRow) -> dict[str, Any]:
    return {"seq": row.seq, "at": row.at, "kind": row.kind, "job": row.job, "node": row.node}


CURVES = ("TrainingProgressed", "EvaluationCompleted")


async def dashboard(view: StateView, curves: LossCurves, finished: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the page shows, as JSON: one read of the view (the store read on its reader threads). A finished
    job's part is read once and kept in ``finished`` (it no longer changes)."""
    cluster = view.cluster()
    jobs = []
    for job in cluster.jobs:
        kept = finished.get(job.id)
        if kept is not None and kept["state"] == str(job.state):
            jobs.append(kept)
            continue
        detail = await view.job_detail(job.id)
        if detail is None:
            continue
        found = {kind: list(await view.recent_events(job.id, (kind,), CURVE_POINTS)) for kind in CURVES}
        shown = job_view(detail.job, detail.generations, found, curves.of(job.id))
        if detail.job.state in JOB_TERMINAL:
            finished[job.id] = shown
        jobs.append(shown)
    for gone in set(finished) - {job.id for job in cluster.jobs}:
        del finished[gone]
    newest = await view.recent_events(None, None, EVENTS_SHOWN)
    return {
        "now": view.now(),
        "started_at": cluster.started_at,
        "nodes": [node_view(n) for n in cluster.nodes],
        "jobs": jobs,
        "queue": list(cluster.queue),
        "events": [event_view(e) for e in reversed(newest)],
    }


def refusal(authorization: str, tokens: Tokens) -> web.Response | None:
    """401 without a known token, 403 for a token of another role (an agent's, a node's); None: may read."""
    scheme, _, token = authorization.partition(" ")
    principal = tokens.identify(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
    if principal is None:
        return web.Response(
            status=401,
            text="an operator or reader token is needed: Authorization: Bearer TOKEN\n",
            headers={**NO_STORE, "WWW-Authenticate": 'Bearer realm="spotmorph"'},
        )
    if principal.role not in READERS:
        return web.Response(status=403, text="the dashboard is for operator or reader tokens\n", headers=NO_STORE)
    return None


def add_routes(app: web.Application, view: StateView, tokens: Tokens, curves: LossCurves) -> None:
    """``GET /``: the page; ``GET /api/v1/dashboard``: what it shows, for operator and reader tokens."""

    async def page(_request: web.Request) -> web.Response:
        headers = {**NO_STORE, "Content-Security-Policy": PAGE_POLICY}
        return web.Response(text=HTML, content_type="text/html", charset="utf-8", headers=headers)

    finished: dict[str, dict[str, Any]] = {}

    async def data(request: web.Request) -> web.Response:
        refused = refusal(request.headers.get("Authorization", ""), tokens)
        if refused is not None:
            return refused
        body = json.dumps(await dashboard(view, curves, finished), allow_nan=False)
        return web.Response(text=body, content_type="application/json", headers=NO_STORE)

    app.router.add_get("/", page)
    app.router.add_get(API_PATH, data)
