"""The web dashboard: one read-only page served beside ``/metrics``, and the JSON it draws.

No build step and nothing fetched from elsewhere: the page (``dashboard.html`` beside this module) is one
HTML file with its script and style inline; it puts every string from the controller in as text
(``textContent``), never as HTML, since job reasons and event text come from users and nodes. It asks
``GET /api/v1/dashboard`` every few seconds with a token (typed once into the page, or given in the
address's fragment ``#token=...``, which browsers never send to a server) and draws the nodes with their
GPUs, the jobs with their layouts, each job's morph timeline, its loss, eval-loss and samples/s charts (axes,
a log scale, values under the pointer, a line at each morph), one chart comparing the jobs' losses, and the
newest events (filtered by kind, runs of checkpoint events folded); :mod:`dashboard_views` builds each piece
of the JSON. The JSON comes from the state view the status RPCs read, behind the same tokens (operator or
reader); the controller serves it over TLS, or on loopback only.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from aiohttp import web

from controller.core.events import EventKind
from controller.core.lifecycle import JOB_TERMINAL
from controller.observability.curves import LossCurves
from controller.observability.dashboard_views import CURVE_POINTS, event_view, job_view, node_view
from controller.shell.views import StateView
from controller.tokens import Role, Tokens

API_PATH = "/api/v1/dashboard"
HTML = files("controller.observability").joinpath("dashboard.html").read_text(encoding="utf-8")
EVENTS_SHOWN = 200  # the newest events listed (the page folds runs of checkpoint events)
READERS = frozenset({Role.OPERATOR, Role.READER})
NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
# The page's own script and style, and requests to this origin; nothing else (no frames, no other hosts).
PAGE_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# A job's events the page draws from: its curves, and the step each generation resumed at (the morph markers).
CURVES = (EventKind.TRAINING_PROGRESSED, EventKind.EVALUATION_COMPLETED)


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
        found = {str(kind): list(await view.recent_events(job.id, (kind,), CURVE_POINTS)) for kind in CURVES}
        shown = job_view(detail.job, detail.generations, found, curves.of(job.id), curves.rates_of(job.id))
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
