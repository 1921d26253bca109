"""Trace-driven simulation of training policies on spot availability (``spotmorph simulate``).

Every policy sees the same trace and profile; time advances from event to event and a policy is
either training at its layout's predicted rate or down (morphing, restarting, waiting). Policies:

- ``spotmorph``: its planner and morph policy. A removal is announced ``notice_seconds`` ahead; when
  the notice covers a step and a checkpoint write, the morph is planned (no progress lost) and costs
  ``morph_cost_seconds``; otherwise it is an unplanned loss (heartbeat expiry, then resume from the
  newest periodic checkpoint). Arrivals are debounced, then taken only if the policy says they pay.
- ``fixed-pipeline-restart`` (Varuna's released code): P fixed at the start, D = floor(GPUs / P);
  every change that touches the layout is a stop-checkpoint-restart with its fixed waits (120 s
  after a preemption checkpoint, 60 s after a failure) on top of the restart itself.
- ``data-parallel-only`` (torchrun-style elastic): the pipeline depth fixed at the smallest that fits
  the model, D follows the nodes, and every change is a full restart from the last periodic
  checkpoint.
- ``oracle``: the best layout at every instant, morphs free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from morphing.layout import local_nodes
from morphing.planner import Plan, Planner
from morphing.policy import PolicyConfig, decide_morph
from morphing.traces import Trace

POLICIES = ("spotmorph", "fixed-pipeline-restart", "data-parallel-only", "oracle")


@dataclass(frozen=True)
class ReplayConfig:
    gpus_per_node: int = 1
    morph_cost_seconds: float = 15.0  # stop + checkpoint + restart + load (bench/morph_bench.py target)
    notice_seconds: float = 30.0  # Azure Spot's eviction notice
    checkpoint_write_seconds: float = 5.0
    checkpoint_interval_seconds: float = 600.0  # periodic checkpoints of the baselines
    spotmorph_checkpoint_interval_seconds: float = 60.0  # background writes make frequent ones cheap
    detection_seconds: float = 10.0  # heartbeat expiry before an unannounced loss is acted on
    debounce_seconds: float = 60.0
    horizon_seconds: float = 600.0
    hysteresis: float = 0.05
    varuna_preemption_wait_seconds: float = 120.0
    varuna_failure_wait_seconds: float = 60.0
    spot_price_per_gpu_hour: float = 0.918  # AWS p3.2xlarge spot, us-east-1 (2023)
    on_demand_price_per_gpu_hour: float = 3.06  # AWS p3.2xlarge on demand


@dataclass
class _Run:
    """One policy's progress through the trace."""

    rate: float = 0.0
    step_seconds: float = 0.0
    gpus: int = 0
    stages: int | None = None
    resume_at: float = 0.0
    since_checkpoint: float = 0.0
    step_phase: float = 0.0  # running seconds into the current step
    samples: float = 0.0
    lost_samples: float = 0.0
    morphs: int = 0
    pending_decision_at: float | None = None
    used: list[str] = field(default_factory=list)

    def advance(self, start: float, end: float, interval: float) -> None:
        begin = max(start, self.resume_at)
        if end <= begin or self.rate <= 0:
            return
        self.samples += self.rate * (end - begin)
        self.since_checkpoint = (self.since_checkpoint + end - begin) % interval
        if self.step_seconds > 0:
            self.step_phase = (self.step_phase + end - begin) % self.step_seconds

    def restart(self, now: float, downtime: float, plan: Plan | None, per_node: int, live: list[str]) -> None:
        self.morphs += 1
        self.resume_at = now + downtime
        self.since_checkpoint = self.step_phase = 0.0
        self.rate = plan.samples_per_second if plan else 0.0
        self.step_seconds = plan.predicted_step_seconds if plan else 0.0
        self.gpus = plan.gpus_used if plan else 0
        self.used = live[: -(-self.gpus // per_node)] if plan else []

    def lose_progress(self) -> None:
        self.lost_samples += self.rate * self.since_checkpoint
        self.samples -= self.rate * self.since_checkpoint
        self.since_checkpoint = 0.0


class Replay:
    def __init__(self, planner: Planner, config: ReplayConfig) -> None:
        self.planner = planner
        self.config = config
        self._plans: dict[tuple[int, int | None], Plan | None] = {}

    def plan(self, nodes: int, stages: int | None = None) -> Plan | None:
        key = (nodes, stages)
        if key not in self._plans:
            result = self.planner.plan(
                local_nodes(nodes * self.config.gpus_per_node, self.config.gpus_per_node), stages
            )
            self._plans[key] = result if isinstance(result, Plan) else None
        return self._plans[key]

    def run(self, trace: Trace, policy: str) -> _Run:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
        cfg = self.config
        announced = policy in ("spotmorph", "fixed-pipeline-restart")
        timeline = []
        added: dict[str, float] = {}
        for i, e in enumerate(trace.events):
            added.update({e.node: e.seconds} if e.kind == "add" else {})
            # A notice comes up to notice_seconds early, but never before the VM it announces arrived.
            early = e.kind == "remove" and announced
            timeline.append((max(added.get(e.node, 0.0), e.seconds - cfg.notice_seconds) if early else e.seconds, i, e))
        timeline.sort()
        run, live, now = _Run(), list[str](), 0.0
        fixed_stages = self._fixed_stages(policy, trace)
        for when, _, event in timeline:
            now = self._until(run, policy, now, when, live)
            if event.kind == "add":
                live.append(event.node)
            elif event.node in live:
                live.remove(event.node)
            if policy == "oracle":
                plan = self.plan(len(live))
                run.rate = plan.samples_per_second if plan else 0.0
            elif policy == "spotmorph":
                self._spotmorph(run, now, event.kind, event.node, live)
            else:
                self._restarting(run, policy, now, event.kind, event.node, live, fixed_stages)
        self._until(run, policy, now, trace.duration_seconds, live)
        return run

    def _until(self, run: _Run, policy: str, now: float, end: float, live: list[str]) -> float:
        """Advance to ``end``, taking a debounced spotmorph decision when it falls due."""
        cfg = self.config
        interval = (
            cfg.spotmorph_checkpoint_interval_seconds if policy == "spotmorph" else cfg.checkpoint_interval_seconds
        )
        if run.pending_decision_at is not None and run.pending_decision_at <= end:
            due = run.pending_decision_at
            run.advance(now, due, interval)
            run.pending_decision_at, now = None, due
            self._decide_growth(run, now, live)
        run.advance(now, end, interval)
        return max(now, end)

    def _spotmorph(self, run: _Run, now: float, kind: str, node: str, live: list[str]) -> None:
        cfg = self.config
        if kind == "add":
            run.pending_decision_at = now + cfg.debounce_seconds
            return
        if node not in run.used and run.rate > 0:
            return
        rest_of_step = run.step_seconds - run.step_phase
        if cfg.notice_seconds >= rest_of_step + cfg.checkpoint_write_seconds:
            run.restart(now, cfg.morph_cost_seconds, self.plan(len(live)), cfg.gpus_per_node, live)
        else:
            run.lose_progress()
            run.restart(
                now, cfg.detection_seconds + cfg.morph_cost_seconds, self.plan(len(live)), cfg.gpus_per_node, live
            )

    def _decide_growth(self, run: _Run, now: float, live: list[str]) -> None:
        cfg = self.config
        candidate = self.plan(len(live))
        decision = decide_morph(
            current_samples_per_second=run.rate if run.rate > 0 else None,
            current_layout_intact=True,
            candidate_samples_per_second=candidate.samples_per_second if candidate else None,
            morph_cost_seconds=cfg.morph_cost_seconds,
            config=PolicyConfig(cfg.horizon_seconds, cfg.hysteresis),
        )
        if decision.morph:
            run.restart(now, cfg.morph_cost_seconds, candidate, cfg.gpus_per_node, live)

    def _restarting(
        self, run: _Run, policy: str, now: float, kind: str, node: str, live: list[str], stages: int | None
    ) -> None:
        cfg = self.config
        plan = self.plan(len(live), stages)
        new_gpus = plan.gpus_used if plan else 0
        if new_gpus == run.gpus and not (kind == "remove" and node in run.used):
            return
        if policy == "data-parallel-only":
            run.lose_progress()
            run.restart(now, cfg.morph_cost_seconds, plan, cfg.gpus_per_node, live)
            return
        wait = cfg.varuna_preemption_wait_seconds if kind == "remove" else cfg.varuna_failure_wait_seconds
        run.restart(now, cfg.morph_cost_seconds + wait, plan, cfg.gpus_per_node, live)

    def _fixed_stages(self, policy: str, trace: Trace) -> int | None:
        if policy == "data-parallel-only":
            return self.planner.smallest_pipeline()
        if policy == "fixed-pipeline-restart":
            for _, count in trace.availability():
                plan = self.plan(count)
                if plan is not None:
                    return plan.layout.pipeline_stages
        return None


def simulate_policies(planner: Planner, trace: Trace, config: ReplayConfig) -> dict[str, Any]:
    """Every policy on the trace, in the JSON shape of ``spotmorph simulate --json``."""
    replay = Replay(planner, config)
    runs = {policy: replay.run(trace, policy) for policy in POLICIES}
    oracle = runs["oracle"].samples or 1.0
    gpu_hours = _gpu_hours(trace, config.gpus_per_node)
    batch = planner.global_batch
    points = trace.availability()
    mean_nodes = round(sum(n for _, n in points) / len(points)) if points else 0
    reference = replay.plan(max(mean_nodes, 1))
    policies = {}
    for name, run in runs.items():
        on_demand_hours = (
            run.samples / reference.samples_per_second / 3600 * reference.gpus_used if reference else float("nan")
        )
        policies[name] = {
            "samples": run.samples,
            "steps": run.samples / batch,
            "goodput_vs_oracle": run.samples / oracle,
            "morphs": run.morphs,
            "steps_lost": run.lost_samples / batch,
            "gpu_hours": gpu_hours,
            "cost_spot": gpu_hours * config.spot_price_per_gpu_hour,
            "cost_on_demand_same_samples": on_demand_hours * config.on_demand_price_per_gpu_hour,
        }
    return {
        "trace": {"shape": trace.shape, "events": len(trace.events), "hours": trace.duration_seconds / 3600},
        "global_batch": batch,
        "gpus_per_node": config.gpus_per_node,
        "policies": policies,
    }


def _gpu_hours(trace: Trace, per_node: int) -> float:
    points = trace.availability()
    total = 0.0
    for (start, count), (end, _) in zip(points, [*points[1:], (trace.duration_seconds, 0)], strict=True):
        total += count * per_node * (end - start)
    return total / 3600
