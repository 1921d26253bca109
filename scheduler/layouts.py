"""Which layout a job runs on a GPU count: the one with the best liveput, not only the fastest (Parcae, NSDI'24).

The planner's candidates for ``n`` GPUs are its best layout at each pipeline depth (:func:`options`). Each is
judged by what it does now and by what one likely loss does to it: when a spot node it uses is evicted, the
job either keeps the layout's stage partition with one replica fewer (every survivor keeps the layers it
holds: a morph of ``LossCosts.morph_seconds``), or is re-planned on the GPUs left (layers move to new stages,
some from the checkpoint: ``morph_seconds + reload_seconds``), whichever does more work in the horizon.
A layout with one replica cannot keep its partition (the loss takes a stage's only copy); one that leaves a
node idle is hit only when the loss lands on a GPU it uses, and then the idle node takes the lost ranks'
place (from a peer replica: a morph; else from disk).

liveput is the expected samples/s over the horizon (the speed until the first loss, an exponential time at
the pool's eviction rate, then the pause and the speed after it), and :func:`choose` takes the best; with
no evictions that is the planner's fastest. Pure: the planner is only asked (no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from morphing.errors import UserInputError
from morphing.layout import Layout, contiguous_placement, local_nodes
from morphing.plan_result import Plan
from morphing.planner import Planner
from scheduler.forecast import HOUR, Rates


@dataclass(frozen=True)
class LossCosts:
    """Seconds of no training after a loss: a morph that keeps the stage partition, and what a re-partition
    adds (layers moved, some read back from the checkpoint)."""

    morph_seconds: float = 15.0
    reload_seconds: float = 60.0

    def __post_init__(self) -> None:
        if min(self.morph_seconds, self.reload_seconds) < 0:
            raise ValueError("loss costs must be >= 0")


@dataclass(frozen=True)
class LayoutOption:
    """One candidate layout on ``gpus`` GPUs and what a loss of one node of it leaves.

    ``kept_samples_per_second``: the same stage partition with the replicas that fit on what is left (0: it
    cannot be kept); ``replanned_samples_per_second``: the planner's best on what is left."""

    samples_per_second: float
    gpus: int  # the GPUs offered
    gpus_used: int
    stages: int
    replicas: int
    kept_samples_per_second: float
    replanned_samples_per_second: float
    layout: Layout | None = None

    def __post_init__(self) -> None:
        if not 0 < self.gpus_used <= self.gpus or self.samples_per_second < 0:
            raise ValueError("a layout option uses 1..gpus GPUs at >= 0 samples/s")


@dataclass(frozen=True)
class Judged:
    """An option's liveput and the loss it expects: what :func:`choose` compares, and what a replay charges."""

    option: LayoutOption
    liveput: float
    expected_loss_samples_per_second: float
    loss_pause_seconds: float  # the pause one loss costs (a morph, or a morph and a reload)
    keeps_partition: bool  # its likely loss is best met by keeping the partition


def judge(
    option: LayoutOption, spot: Rates, gpus_per_node: int, horizon_seconds: float, costs: LossCosts = LossCosts()
) -> Judged:
    """``option``'s liveput over ``horizon_seconds``: its speed until the first loss of a node it uses (an
    exponential time at the pool's eviction rate), then the pause and the speed of the better way on (keep
    the partition, or re-plan), as samples/s over the horizon."""
    window = max(horizon_seconds, 1e-9)
    losses = spot.eviction * -(-option.gpus_used // gpus_per_node)  # per second, on the nodes it uses
    hit = 1.0 - math.exp(-losses * window)  # a loss within the horizon
    before = hit / losses if losses > 0 else window  # expected time until it (or the horizon's end)

    def after(speed: float, pause: float) -> float:
        return speed * max(0.0, window - before - hit * pause)

    keep = after(option.kept_samples_per_second, costs.morph_seconds)
    replan = after(option.replanned_samples_per_second, costs.morph_seconds + costs.reload_seconds)
    keeps = option.kept_samples_per_second > 0 and keep >= replan
    live = (
        (option.samples_per_second * before + max(keep, replan)) / window if losses > 0 else option.samples_per_second
    )
    pause = costs.morph_seconds + (0.0 if keeps else costs.reload_seconds)
    return Judged(option, live, option.samples_per_second - live, pause, keeps)


def choose(
    candidates: Sequence[LayoutOption],
    spot: Rates,
    gpus_per_node: int = 1,
    horizon_seconds: float = 1800.0,
    costs: LossCosts = LossCosts(),
) -> Judged | None:
    """The candidate with the best liveput (ties: the faster, then the fewer GPUs); ``None`` when there is none."""
    judged = [judge(c, spot, gpus_per_node, horizon_seconds, costs) for c in candidates]
    return max(
        judged,
        key=lambda j: (j.liveput, j.option.samples_per_second, -j.option.gpus_used, -j.option.stages),
        default=None,
    )


def options(planner: Planner, gpus: int, gpus_per_node: int = 1) -> tuple[LayoutOption, ...]:
    """The planner's best layout at each pipeline depth on ``gpus`` GPUs, each with what a loss of one node
    leaves it (kept partition, or re-planned)."""
    if gpus <= 0:
        return ()
    nodes = local_nodes(gpus, gpus_per_node)
    left = gpus - gpus_per_node
    replanned = _speed(planner.plan(local_nodes(left, gpus_per_node))) if left > 0 else 0.0
    out: list[LayoutOption] = []
    for stages in range(1, min(planner.num_layers, gpus) + 1):
        plan = planner.plan(nodes, stages=stages)
        if not isinstance(plan, Plan):
            continue
        lay, speed = plan.layout, plan.samples_per_second
        spare = lay.world_size + gpus_per_node <= gpus  # an idle node can take the lost ranks' place
        kept = speed if spare and lay.data_parallel > 1 else _kept(planner, lay, left, gpus_per_node)
        again = max(replanned, speed) if spare else replanned  # a spare, the lost stage read back from disk
        option = LayoutOption(speed, gpus, lay.world_size, lay.pipeline_stages, lay.data_parallel, kept, again, lay)
        if option not in out:
            out.append(option)
    return tuple(out)


def _kept(planner: Planner, layout: Layout, left: int, gpus_per_node: int) -> float:
    """Samples/s of ``layout``'s stage partition with the replicas that fit on ``left`` GPUs (0: none does)."""
    stages = layout.pipeline_stages
    replicas = min(layout.data_parallel - 1, left // stages) if left > 0 else 0
    if replicas <= 0:
        return 0.0
    try:
        kept = Layout(
            stages,
            replicas,
            layout.micro_batch_size,
            layout.global_batch,
            layout.stage_layers,
            contiguous_placement(stages * replicas, local_nodes(left, gpus_per_node)),
        )
    except UserInputError:
        return 0.0
    return _speed(planner.evaluate(kept))


def _speed(result: object) -> float:
    return result.samples_per_second if isinstance(result, Plan) else 0.0


def steadiest(
    planner: Planner,
    nodes: Sequence[tuple[str, int]],
    fastest: Plan,
    spot: Rates,
    costs: LossCosts = LossCosts(),
    horizon_seconds: float = 1800.0,
    least_gpus: int = 1,
) -> Plan:
    """The plan to run on ``nodes``: the planner's ``fastest`` unless the best layout of another pipeline depth on
    the same GPUs has a better liveput (:func:`judge` over :func:`options`, the nodes taken as alike: each as many
    GPUs as the largest). The plan chosen instead says why in its notes."""
    if spot.eviction <= 0:
        return fastest
    per_node = max((slots for _, slots in nodes), default=1)
    offered = sum(slots for _, slots in nodes)
    candidates = options(planner, offered, per_node)
    same = [o for o in candidates if o.stages == fastest.layout.pipeline_stages]
    if not same:
        return fastest
    current = judge(replace(same[0], samples_per_second=fastest.samples_per_second), spot, per_node,
                    horizon_seconds, costs)  # fmt: skip
    picked = choose(candidates, spot, per_node, horizon_seconds, costs)
    if picked is None or picked.option.stages == current.option.stages or picked.liveput <= current.liveput:
        return fastest
    plan = planner.plan(nodes, stages=picked.option.stages, least_gpus=least_gpus)
    if not isinstance(plan, Plan) or (plan.gpus_used, plan.layout.data_parallel) != (
        picked.option.gpus_used,
        picked.option.replicas,
    ):
        return fastest  # on these nodes (or with least_gpus) that depth's best is not the layout judged
    why = (
        f"liveput: {plan.layout.describe()} over the fastest {fastest.layout.describe()} "
        f"({picked.liveput:.3g} vs {current.liveput:.3g} samples/s expected over {horizon_seconds:g} s at "
        f"{spot.eviction * HOUR:.3g} evictions a node-hour"
        + ("; a loss keeps its stage partition)" if picked.keeps_partition else ")")
    )
    return replace(plan, notes=(*plan.notes, why))
