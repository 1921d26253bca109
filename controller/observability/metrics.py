"""Prometheus metrics, read from the controller's state at scrape time (``--metrics-listen``).

Nothing is counted on the hot path: a scrape takes one snapshot from the state view (nodes and jobs by
state, failed jobs by cause, steps lost, measured samples/s; generations, so morphs by cause and their
durations; provider error events; the heartbeat-latency histogram the server already keeps) and renders it. Served by
aiohttp in the controller's own event loop; the view reads the store on its reader threads, so a
scrape never blocks the loop, and rendering a frozen snapshot never races the runner.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from controller.core.causes import JobFailureCause
from controller.core.lifecycle import JobState, NodeState
from controller.core.scheduler_status import step_time_status
from controller.observability.curves import LossCurves
from controller.shell.latency import BOUNDS
from controller.shell.views import MetricsSnapshot, StateView
from controller.tokens import Tokens

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MORPH_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


ROUTINE_PROVIDER_EVENTS = frozenset({"ScaleOut", "ScaleOutDone", "DeleteInstances", "AgentTokenDelivered"})


def provider_error(kind: str) -> bool:
    """Provider events that report trouble (not the routine scale-outs and deletions); ``Azure*`` is how a
    state database written before the kinds were any provider's names them."""
    for prefix in ("Provider", "Azure"):
        if kind.startswith(prefix):
            return kind.removeprefix(prefix) not in ROUTINE_PROVIDER_EVENTS
    return False


def families(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    """The metric families of one scrape: a pure function of what the view saw."""
    nodes = GaugeMetricFamily("spotmorph_nodes", "Nodes by lifecycle state", labels=["state"])
    by_state = Counter(str(n.state) for n in snapshot.nodes)
    for state in NodeState:
        nodes.add_metric([str(state)], by_state.get(str(state), 0))
    yield nodes
    jobs = GaugeMetricFamily("spotmorph_jobs", "Jobs by lifecycle state", labels=["state"])
    job_states = Counter(str(j.state) for j in snapshot.jobs)
    for job_state in JobState:
        jobs.add_metric([str(job_state)], job_states.get(str(job_state), 0))
    yield jobs
    failed = GaugeMetricFamily(
        "spotmorph_jobs_failed",
        "FAILED jobs by cause (user_error: fix the job; the others: look at the cluster)",
        labels=["cause"],
    )
    causes = Counter(str(j.failure_cause) for j in snapshot.jobs if j.state is JobState.FAILED and j.failure_cause)
    for cause in JobFailureCause:
        failed.add_metric([str(cause)], causes.get(str(cause), 0))
    yield failed
    yield from _jobs(snapshot)
    yield from _scheduler(snapshot)
    yield from _morphs(snapshot)
    latency = snapshot.heartbeat_latency
    yield _histogram(
        "spotmorph_heartbeat_latency_seconds",
        "Server-side time to handle a Heartbeat",
        _cumulative(latency.counts, LATENCY_BUCKETS),
        latency.sum_seconds,
    )
    leading = GaugeMetricFamily("spotmorph_controller_leading", "1 while this controller leads (0: standby)")
    leading.add_metric([], 1 if snapshot.leading else 0)
    yield leading
    yield GaugeMetricFamily(
        "spotmorph_controller_epoch", "The leader lease's epoch this controller leads under", value=snapshot.epoch
    )
    errors = CounterMetricFamily("spotmorph_provider_errors", "Provider errors by kind", labels=["kind"])
    for kind, count in sorted(snapshot.event_counts.items()):
        if provider_error(kind):
            errors.add_metric([kind], count)
    yield errors


def _jobs(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    lost = GaugeMetricFamily("spotmorph_steps_lost", "Steps a job had to redo after losses", labels=["job"])
    rate = GaugeMetricFamily(
        "spotmorph_job_samples_per_second", "Samples/s measured in the running generation", labels=["job"]
    )
    eval_loss = GaugeMetricFamily(
        "spotmorph_job_eval_loss", "Mean loss over the eval dataset at the newest evaluation", labels=["job"]
    )
    eval_step = GaugeMetricFamily("spotmorph_job_eval_step", "Step of the newest evaluation", labels=["job"])
    loss = GaugeMetricFamily("spotmorph_job_loss", "Training loss of the newest step reported", labels=["job"])
    loss_step = GaugeMetricFamily("spotmorph_job_loss_step", "Step of the newest training loss", labels=["job"])
    stall = GaugeMetricFamily(
        "spotmorph_checkpoint_stall_seconds",
        "How long the newest checkpoint paused training (its slowest rank's copy to host memory, plus the write "
        "when not in the background)",
        labels=["job"],
    )
    stall_step = GaugeMetricFamily(
        "spotmorph_checkpoint_stall_step", "Step of the checkpoint whose stall is reported", labels=["job"]
    )
    for job in snapshot.jobs:
        lost.add_metric([job.id], job.steps_lost)
        if job.evaluation.loss is not None:
            eval_loss.add_metric([job.id], job.evaluation.loss)
            eval_step.add_metric([job.id], job.evaluation.step)
        if job.training.loss is not None:
            loss.add_metric([job.id], job.training.loss)
            loss_step.add_metric([job.id], job.training.step)
        if job.checkpoint_stall.seconds is not None:
            stall.add_metric([job.id], job.checkpoint_stall.seconds)
            stall_step.add_metric([job.id], job.checkpoint_stall.step)
        elapsed = snapshot.now - job.state_since
        if job.state is JobState.RUNNING and elapsed > 0 and job.step > job.resumed_at_step:
            rate.add_metric([job.id], (job.step - job.resumed_at_step) * job.spec.global_batch / elapsed)
    yield lost
    yield rate
    yield eval_loss
    yield eval_step
    yield loss
    yield loss_step
    yield stall
    yield stall_step


def _scheduler(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    """Why jobs hold on-demand capacity (the cause a label), what it costs, and the planner's step-time error."""
    wanted = GaugeMetricFamily(
        "spotmorph_job_on_demand_gpus",
        "On-demand GPUs the scheduler wants the job to hold, by why (scheduler.deadlines.CapacityCause)",
        labels=["job", "cause"],
    )
    held = GaugeMetricFamily(
        "spotmorph_job_on_demand_held_gpus", "On-demand GPUs of the nodes it holds now", labels=["job"]
    )
    cost = GaugeMetricFamily(
        "spotmorph_job_on_demand_cost_dollars",
        "What the on-demand nodes it holds now cost since each joined, at the configured GPU-hour price",
        labels=["job"],
    )
    spent = GaugeMetricFamily(
        "spotmorph_job_on_demand_spent_dollars",
        "What all its on-demand capacity cost, the nodes given back included, at the configured GPU-hour price",
        labels=["job"],
    )
    deadline = GaugeMetricFamily("spotmorph_job_deadline_seconds", "Seconds to the job's deadline", labels=["job"])
    spot = GaugeMetricFamily(
        "spotmorph_job_spot_samples_per_second",
        "Samples/s the scheduler expects on spot alone (liveput), at the decision that set its on-demand level",
        labels=["job"],
    )
    error = GaugeMetricFamily(
        "spotmorph_job_step_time_error",
        "|predicted - measured| / measured step time at the newest check, before and after the online correction",
        labels=["job", "correction"],
    )
    for job in snapshot.jobs:
        status = snapshot.on_demand.get(job.id)
        if status is not None:
            wanted.add_metric([job.id, str(status.cause or "")], status.gpus)
            held.add_metric([job.id], status.held_gpus)
            cost.add_metric([job.id], status.cost_dollars)
            spent.add_metric([job.id], status.spent_dollars)
            spot.add_metric([job.id], status.spot_samples_per_second)
            if status.deadline_in_seconds is not None:
                deadline.add_metric([job.id], status.deadline_in_seconds)
        checked = step_time_status(job)
        if checked is not None and checked.error_before is not None:
            error.add_metric([job.id, "before"], checked.error_before)
            if checked.error_after is not None:
                error.add_metric([job.id, "after"], checked.error_after)
    yield from (wanted, held, cost, spent, deadline, spot, error)


def _morphs(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    counts: Counter[str] = Counter()
    durations: list[float] = []
    pauses: list[float] = []
    stalls: list[float] = []
    for row in snapshot.generations:
        if row.generation <= 1:
            continue
        counts[str(row.morph_cause)] += 1  # the stored label, never the words
        if row.morph_seconds is not None:
            durations.append(row.morph_seconds)
        if row.pause_seconds is not None:
            pauses.append(row.pause_seconds)
        if row.stalled_seconds is not None:
            stalls.append(row.stalled_seconds)
    morphs = CounterMetricFamily("spotmorph_morphs", "Morphs (generations after the first) by cause", labels=["cause"])
    for cause, count in sorted(counts.items()):
        morphs.add_metric([cause], count)
    yield morphs
    yield _seconds_histogram(
        "spotmorph_morph_seconds", "Morph decision times (start of the morph to the new generation's issue)", durations
    )
    yield _seconds_histogram(
        "spotmorph_morph_pause_seconds",
        "Pauses training felt (last step before a morph to the first step after it, trainers' clocks)",
        pauses,
    )
    yield _seconds_histogram(
        "spotmorph_morph_stalled_seconds",
        "Of those pauses, the time no rank could step (to the new generation's first step begun)",
        stalls,
    )


def _seconds_histogram(name: str, documentation: str, values: list[float]) -> Metric:
    buckets = [(bound, sum(1 for v in values if v <= bound)) for bound in MORPH_BUCKETS]
    return _histogram(name, documentation, [*buckets, (float("inf"), len(values))], sum(values))


def _cumulative(counts: Sequence[int], bounds: tuple[float, ...]) -> list[tuple[float, int]]:
    """Fine log-spaced histogram counts folded into Prometheus' cumulative ``le`` buckets."""
    out, running, index = [], 0, 0
    for bound in bounds:
        while index < len(BOUNDS) and BOUNDS[index] <= bound * (1 + 1e-9):
            running += counts[index]
            index += 1
        out.append((bound, running))
    out.append((float("inf"), sum(counts)))
    return out


def _histogram(name: str, documentation: str, buckets: list[tuple[float, int]], total: float) -> Metric:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], [(_le(b), float(c)) for b, c in buckets], sum_value=total)
    return family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class _SnapshotCollector:
    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return families(self.snapshot)


def render(snapshot: MetricsSnapshot) -> bytes:
    """``snapshot`` in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshot))
    return generate_latest(registry)


def host_names(listen_host: str, extra: Sequence[str] = ()) -> frozenset[str]:
    """The names a request's Host header may give (besides an IP address): the listen address's host when it
    is a name, this machine's names, localhost, and the operator's ``extra`` ones, lower-case."""
    names = {"localhost", socket.gethostname(), socket.getfqdn(), listen_host.strip("[]"), *extra}
    return frozenset(n.lower() for n in names if n)


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    """Whether a Host header names this server: an IP address literal (which DNS rebinding cannot give: it
    needs a name the attacker controls), or one of ``names``. A missing header is allowed (HTTP/1.0, curl -H
    'Host:'): a browser always sends one."""
    if header is None:
        return True
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host in names


async def serve_metrics(
    listen: str,
    view: StateView,
    tls: ssl.SSLContext | None = None,
    dashboard: tuple[Tokens, LossCurves] | None = None,
    allowed_hosts: Sequence[str] = (),
) -> tuple[Any, int]:
    """``GET /metrics`` on ``listen`` (HOST:PORT; port 0 picks one), over HTTPS with ``tls``; with
    ``dashboard`` the web dashboard too (:mod:`.dashboard`), its data for those tokens' readers.

    A request whose Host header names another server (a page of another origin reaching it through DNS
    rebinding) is answered 421 (:func:`host_allowed`; ``allowed_hosts``: more names it may give).
    Returns (runner to clean up, port). An empty HOST is every interface, as for the gRPC port.
    """
    from aiohttp import web

    from controller.observability.dashboard import add_routes

    names = host_names(listen.rpartition(":")[0], allowed_hosts)

    async def metrics(_request: web.Request) -> web.Response:
        snapshot = await view.metrics()
        return web.Response(body=render(snapshot), headers={"Content-Type": "text/plain; version=0.0.4"})

    @web.middleware
    async def only_this_host(request: web.Request, handler: Any) -> web.StreamResponse:
        if not host_allowed(request.headers.get("Host"), names):
            return web.Response(
                status=421,
                text=f"Host {request.headers.get('Host', '')[:100]!r} is not this server's name; use its address "
                "or a name given in metrics_allowed_hosts\n",
            )
        response: web.StreamResponse = await handler(request)
        return response

    app = web.Application(middlewares=[only_this_host])
    app.router.add_get("/metrics", metrics)
    if dashboard is not None:
        add_routes(app, view, *dashboard)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), int(port)))
    site = web.SockSite(runner, sock, ssl_context=tls)
    await site.start()
    return runner, int(sock.getsockname()[1])
