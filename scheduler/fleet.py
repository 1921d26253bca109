"""Several jobs replayed against one spot trace under a policy (``spotmorph simulate --jobs``).

Time advances in ticks (``tick_seconds``). At each tick the spot nodes are the trace's, on-demand nodes are
the ones requested (they arrive ``on_demand_start_seconds`` later, billed from the request), and the policy
is :func:`scheduler.policy.decide` with one on-demand rule: ``spotmorph`` (the forecast, learnt from the trace
as it is replayed and from nothing before it), ``spot-only``, ``on-demand-only``, ``uniform-progress``. Every
change of a job's GPUs is a morph (``ReplayConfig.morph_cost_seconds`` without training; a job's start too);
an evicted node whose notice cannot cover a step and a checkpoint write also loses the work since the job's
last checkpoint, after the heartbeat detection time (``ReplayConfig``: the single-job replay's costs). A job
pays for the GPUs it holds (spot GPUs nobody holds are not bought). After the trace ends, the spot capacity
stays as it was last, for at most ``extra_hours``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from morphing.replay import ReplayConfig
from morphing.traces import Trace
from scheduler.deadlines import OnDemandRule
from scheduler.forecast import PoolStats, Rates, observe, rates
from scheduler.jobs import Grant, JobView, Node, OnDemand
from scheduler.layouts import Judged, LayoutOption, LossCosts, choose, judge
from scheduler.policy import CapacityChange, SchedulerConfig, decide
from scheduler.pools import PoolKind

POLICIES: dict[str, OnDemandRule] = {
    "spotmorph": OnDemandRule.FORECAST,
    "spot-only": OnDemandRule.NEVER,
    "on-demand-only": OnDemandRule.ALWAYS,
    "uniform-progress": OnDemandRule.UNIFORM_PROGRESS,
}
HOUR = 3600.0


@dataclass(frozen=True)
class FleetJob:
    name: str
    rates: tuple[float, ...]
    global_batch: int
    steps: int
    priority: int = 0
    deadline_hours: float | None = None
    submit_hour: float = 0.0
    on_demand: OnDemand = OnDemand.ALLOWED
    on_demand_cap_gpus: int | None = None
    # Per GPU count, the planner's candidate layouts (scheduler.layouts.options): when given, the job runs the
    # one FleetConfig.layout_choice picks at that count, and each node it loses pauses it for that layout's
    # loss (a morph that keeps its partition, or a re-partition with a checkpoint reload).
    layouts: tuple[tuple[LayoutOption, ...], ...] = ()


@dataclass(frozen=True)
class FleetConfig:
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    tick_seconds: float = 60.0
    extra_hours: float = 72.0
    layout_choice: str = "liveput"  # or "fastest" (the planner's best samples/s); for jobs with layouts
    loss_costs: LossCosts = field(default_factory=LossCosts)
    layout_horizon_seconds: float = 1800.0


@dataclass(frozen=True)
class JobOutcome:
    finished_hour: float | None
    met_deadline: bool | None
    cost: float
    spot_gpu_hours: float
    on_demand_gpu_hours: float
    loss_pause_hours: float = 0.0  # pauses its losses cost its layouts (jobs with layouts)


@dataclass
class _Run:
    """One job's progress through the replay (private, mutable)."""

    job: FleetJob
    done: float = 0.0
    resume_at: float = 0.0
    since_checkpoint: float = 0.0
    waited: float = 0.0
    held: tuple[Grant, ...] = ()
    finished_at: float | None = None
    spot_seconds: float = 0.0
    on_demand_seconds: float = 0.0
    layout: Judged | None = None  # the layout it runs (jobs with layouts)
    paused_seconds: float = 0.0  # what its losses cost in pauses

    @property
    def total(self) -> float:
        return float(self.job.steps * self.job.global_batch)

    def rate(self) -> float:
        if self.layout is not None:
            return self.layout.option.samples_per_second
        gpus = sum(g.gpus for g in self.held)
        return self.job.rates[min(gpus, len(self.job.rates) - 1)]


def replay_jobs(jobs: Sequence[FleetJob], trace: Trace, policy: str, config: FleetConfig) -> dict[str, JobOutcome]:
    """Every job's outcome under ``policy`` on ``trace``."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
    cfg = replace(config.scheduler, deadlines=replace(config.scheduler.deadlines, rule=POLICIES[policy]))
    cfg = replace(cfg, gpus_per_node=config.replay.gpus_per_node)
    runs = [_Run(job) for job in jobs]
    state = _Cluster(config, trace)
    end = trace.duration_seconds + config.extra_hours * HOUR
    now = 0.0
    while now <= end and any(r.finished_at is None for r in runs):
        gone = state.advance_trace(now)
        for run in runs:
            _lose(run, gone, now, config.replay)
        views = [_view(run, state.on_demand_gpus(run.job.name, now), config) for run in runs]
        spot = rates(state.stats)
        decision = decide(views, state.nodes(now), spot, now, cfg)
        state.apply(decision.capacity, now, config)
        for run in runs:
            grants = tuple(g for g in decision.grants if g.job == run.job.name)
            gpus = sum(g.gpus for g in grants)
            if set(grants) != set(run.held) or (run.layout is not None and run.layout.option.gpus != gpus):
                run.layout = _layout(run.job, gpus, spot, config)
            _step(run, grants, now, config, state.on_demand_gpus(run.job.name))
        now += config.tick_seconds
    return {run.job.name: _outcome(run, config.replay) for run in runs}


class _Cluster:
    """The nodes present: the trace's spot nodes and the on-demand nodes requested."""

    def __init__(self, config: FleetConfig, trace: Trace) -> None:
        self.per_node = config.replay.gpus_per_node
        self.events = list(trace.events)
        self.live: list[str] = []
        self.on_demand: dict[str, tuple[str, int, float]] = {}  # name: (owner, gpus, arrives at)
        self.serial = 0
        self.stats = PoolStats(PoolKind.SPOT)

    def advance_trace(self, now: float) -> set[str]:
        gone: set[str] = set()
        while self.events and self.events[0].seconds <= now:
            event = self.events.pop(0)
            if event.kind == "add" and event.node not in self.live:
                self.live.append(event.node)
                gone.discard(event.node)
            elif event.kind == "remove" and event.node in self.live:
                self.live.remove(event.node)
                gone.add(event.node)
        self.stats = observe(self.stats, now, len(self.live), evicted=len(gone))
        return gone

    def nodes(self, now: float) -> list[Node]:
        spot = [Node(name, PoolKind.SPOT, self.per_node) for name in self.live]
        ready = [
            Node(name, PoolKind.ON_DEMAND, gpus, owner)
            for name, (owner, gpus, at) in self.on_demand.items()
            if at <= now
        ]
        return spot + ready

    def on_demand_gpus(self, job: str, arrived_by: float | None = None) -> int:
        """The job's on-demand GPUs requested (billed), or those not arrived by ``arrived_by``."""
        return sum(
            gpus
            for owner, gpus, at in self.on_demand.values()
            if owner == job and (arrived_by is None or at > arrived_by)
        )

    def apply(self, changes: Sequence[CapacityChange], now: float, config: FleetConfig) -> None:
        for change in changes:
            for name in change.release_nodes:
                self.on_demand.pop(name, None)
            wanted = change.gpus if change.gpus > 0 else 0
            while wanted > 0:
                self.serial += 1
                gpus = min(wanted, self.per_node)
                arrives = now + config.scheduler.deadlines.on_demand_start_seconds
                self.on_demand[f"od-{self.serial}"] = (change.job, gpus, arrives)
                wanted -= gpus


def _view(run: _Run, pending: int, config: FleetConfig) -> JobView:
    job = run.job
    return JobView(
        name=job.name,
        rates=job.rates,
        remaining_samples=max(0.0, run.total - run.done) if run.finished_at is None else 0.0,
        total_samples=run.total,
        priority=job.priority,
        submitted_at=job.submit_hour * HOUR,
        deadline=None if job.deadline_hours is None else (job.submit_hour + job.deadline_hours) * HOUR,
        on_demand=job.on_demand,
        on_demand_cap_gpus=job.on_demand_cap_gpus,
        waited_seconds=run.waited,
        morph_cost_seconds=config.replay.morph_cost_seconds,
        held=run.held,
        on_demand_pending=pending,
    )


def _layout(job: FleetJob, gpus: int, spot: Rates, config: FleetConfig) -> Judged | None:
    """The layout ``job`` runs on ``gpus`` GPUs (``None``: the job has no layouts, its curve's speed)."""
    if not job.layouts or not 0 < gpus < len(job.layouts) or not job.layouts[gpus]:
        return None
    per_node, horizon, costs = config.replay.gpus_per_node, config.layout_horizon_seconds, config.loss_costs
    picked = choose(job.layouts[gpus], spot if config.layout_choice == "liveput" else Rates(0.0, 0.0), per_node)
    assert picked is not None
    return judge(picked.option, spot, per_node, horizon, costs)


def _lose(run: _Run, gone: set[str], now: float, replay: ReplayConfig) -> None:
    """Evictions of nodes the job holds: a planned morph when the notice covers a step and a checkpoint write,
    else the work since the last checkpoint is lost too, after the heartbeat detection time. A job that runs
    a chosen layout pauses for what the loss costs that layout."""
    if not gone or not any(g.node in gone for g in run.held):
        return
    if run.layout is not None:
        run.resume_at = max(run.resume_at, now) + run.layout.loss_pause_seconds
        run.paused_seconds += run.layout.loss_pause_seconds
    rate = run.rate()
    step = run.job.global_batch / rate if rate > 0 else 0.0
    if replay.notice_seconds < step + replay.checkpoint_write_seconds:
        run.done = max(0.0, run.done - rate * run.since_checkpoint)
        run.since_checkpoint = 0.0
        run.resume_at = max(run.resume_at, now + replay.detection_seconds)
    run.held = tuple(g for g in run.held if g.node not in gone)


def _step(run: _Run, grants: tuple[Grant, ...], now: float, config: FleetConfig, on_demand_billed: int) -> None:
    """One tick of a job: a morph if its GPUs changed, its progress, its bill."""
    tick, replay = config.tick_seconds, config.replay
    if run.finished_at is not None or now < run.job.submit_hour * HOUR:
        return
    if set(grants) != set(run.held):
        run.resume_at = max(run.resume_at, now) + replay.morph_cost_seconds
        run.since_checkpoint = 0.0
    run.held = grants
    gpus = sum(g.gpus for g in grants)
    run.waited = run.waited + tick if gpus == 0 else 0.0
    run.spot_seconds += sum(g.gpus for g in grants if g.pool is PoolKind.SPOT) * tick
    run.on_demand_seconds += on_demand_billed * tick
    running = max(0.0, now + tick - max(now, run.resume_at))
    rate = run.rate()
    if running <= 0 or rate <= 0:
        return
    left = run.total - run.done
    if rate * running >= left:
        run.finished_at = max(now, run.resume_at) + left / rate
        run.done = run.total
        return
    run.done += rate * running
    interval = replay.spotmorph_checkpoint_interval_seconds
    run.since_checkpoint = (run.since_checkpoint + running) % interval


def _outcome(run: _Run, replay: ReplayConfig) -> JobOutcome:
    spot, on_demand = run.spot_seconds / HOUR, run.on_demand_seconds / HOUR
    cost = spot * replay.spot_price_per_gpu_hour + on_demand * replay.on_demand_price_per_gpu_hour
    finished = None if run.finished_at is None else run.finished_at / HOUR
    deadline = run.job.deadline_hours
    met = None if deadline is None else finished is not None and finished <= run.job.submit_hour + deadline + 1e-9
    return JobOutcome(finished, met, cost, spot, on_demand, run.paused_seconds / HOUR)


def simulate_jobs(
    jobs: Sequence[FleetJob], trace: Trace, config: FleetConfig, policies: Sequence[str] = tuple(POLICIES)
) -> dict[str, object]:
    """Every policy on the jobs and the trace, in the JSON shape of ``spotmorph simulate --jobs --json``."""
    out: dict[str, object] = {}
    for policy in policies:
        outcomes = replay_jobs(jobs, trace, policy, config)
        out[policy] = {
            "jobs": {name: o.__dict__ for name, o in outcomes.items()},
            "cost": sum(o.cost for o in outcomes.values()),
            "deadlines_met": sum(1 for o in outcomes.values() if o.met_deadline),
        }
    return out
