"""Peer snapshots: every stage's state also lives in another node's memory, so a kill costs at most one step.

In a layout where some stage's replicas all sit on one node, a kill of that node without notice loses the
only copy of the stage: the survivors cannot hold a complete step and the job falls back to its last
checkpoint. With snapshots, every ``snapshot_interval`` steps every rank copies its stage (parameters and
optimizer state, in the job's dtype) to host memory at the step boundary and keeps that copy (a kill must find
every stage at one step, a replicated stage's survivor too), and each such stage's lowest rank streams its copy
in the background to a rank on ANOTHER node (:func:`plan_snapshots`), which keeps it in host memory.

Pure, shared by the trainers (who sends to whom), the controller (what a kill leaves and which step to resume
from: :func:`choose_recovery`) and the planner's memory accounting (:func:`snapshot_memory`). No I/O.

Why one node's loss always leaves every stage somewhere when a plan protects every stage: a stage whose sender
sat on the lost node has its copy on the receiver's node (never the sender's); a stage whose sender sat
elsewhere still has the sender's own copy. With one node only, nothing can leave it: the plan says so
(:attr:`SnapshotPlan.unprotected`), and status shows it.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from morphing.layout import Layout

KEPT_SNAPSHOTS = 2
SNAPSHOT_BUDGET = 0.05
"""The share of the steps between two snapshots one snapshot may cost: the interval widens until it does."""
MEASURED_SNAPSHOTS = 2
"""Committed snapshots a generation times before it settles its interval (:func:`settled_interval`)."""
"""Snapshots a rank keeps at once: the last committed one and the one in flight (a kill mid-stream still leaves
the committed one), each as its own copy and the copy it received."""


class RecoverySource(enum.StrEnum):
    """Where the generation after an unplanned loss takes its step from (events and status say it)."""

    MEMORY = "memory"  # the survivors' live state: every stage has a survivor holding the step
    SNAPSHOT = "snapshot"  # some stage only in a peer snapshot (a receiver's copy, or its sender's own copy)
    CHECKPOINT = "checkpoint"  # the newest durable checkpoint


@dataclass(frozen=True, order=True)
class SnapshotRoute:
    """Stage ``stage``'s state goes from rank ``sender`` to rank ``receiver`` (on another node)."""

    stage: int
    sender: int
    receiver: int


@dataclass(frozen=True)
class SnapshotPlan:
    """Who sends its stage to whom; ``unprotected`` says why some stage is left without a copy ("": none is)."""

    routes: tuple[SnapshotRoute, ...]
    unprotected: str = ""

    @property
    def active(self) -> bool:
        return bool(self.routes)

    def receiver_of(self, sender: int) -> int | None:
        return next((r.receiver for r in self.routes if r.sender == sender), None)

    def senders_to(self, receiver: int) -> tuple[int, ...]:
        return tuple(r.sender for r in self.routes if r.receiver == receiver)


def lonely_stages(layout: Layout) -> tuple[int, ...]:
    """The stages whose every replica sits on one node: that node's loss loses the stage (with replicas on two
    nodes or more, the survivors already hold it)."""
    out = []
    for stage in range(layout.pipeline_stages):
        nodes = {layout.placement[layout.rank(d, stage)].node for d in range(layout.data_parallel)}
        if len(nodes) == 1:
            out.append(stage)
    return tuple(out)


def plan_snapshots(layout: Layout, stage_bytes: Sequence[int] | None = None) -> SnapshotPlan:
    """The routes: each lonely stage's lowest rank sends to a rank on another node, the one that has received the
    fewest bytes so far (``stage_bytes[s]``: stage ``s``'s state; equal weights without), ties to the next
    rank after the sender (a ring when every stage is lonely). Stages in order of decreasing size, then index.
    Every rank computes the same plan."""
    if stage_bytes is not None and len(stage_bytes) != layout.pipeline_stages:
        raise ValueError(f"stage_bytes has {len(stage_bytes)} sizes for {layout.pipeline_stages} stages")
    sizes = list(stage_bytes) if stage_bytes is not None else [1] * layout.pipeline_stages
    lonely = lonely_stages(layout)
    if not lonely:
        return SnapshotPlan(())
    received = dict.fromkeys(range(layout.world_size), 0)
    routes = []
    for stage in sorted(lonely, key=lambda s: (-sizes[s], s)):
        sender = layout.rank(0, stage)
        home = layout.placement[sender].node
        away = [r for r in received if layout.placement[r].node != home]
        if not away:
            why = f"too few nodes: every rank is on {home}, so no snapshot can leave the node it protects"
            return SnapshotPlan((), why)
        receiver = min(away, key=lambda r: (received[r], (r - sender) % layout.world_size))
        received[receiver] += sizes[stage]
        routes.append(SnapshotRoute(stage, sender, receiver))
    return SnapshotPlan(tuple(sorted(routes)))


def snapshot_memory(layout: Layout, plan: SnapshotPlan, stage_bytes: Sequence[int]) -> dict[str, int]:
    """Host bytes the snapshots hold on each node of ``layout`` (0 where none): while a plan is active every rank
    keeps copies of its own stage (all stages must be found at one step: a replicated stage's survivor too) and
    each receiver the copies it received, :data:`KEPT_SNAPSHOTS` of each."""
    per_node = dict.fromkeys(layout.nodes(), 0)
    if not plan.active:
        return per_node
    for rank, slot in enumerate(layout.placement):
        per_node[slot.node] += KEPT_SNAPSHOTS * stage_bytes[layout.coords(rank)[1]]
    for route in plan.routes:
        per_node[layout.placement[route.receiver].node] += KEPT_SNAPSHOTS * stage_bytes[route.stage]
    return per_node


def snapshot_refusal(per_node: Mapping[str, int], free_bytes: Mapping[str, int]) -> str:
    """Why the snapshots do not fit the nodes' free host memory ("" when they do): the planner's memory model
    may refuse them, and the job then runs without, saying so."""
    short = [
        (n, need, free_bytes[n]) for n, need in sorted(per_node.items()) if n in free_bytes and need > free_bytes[n]
    ]
    if not short:
        return ""
    name, need, free = short[0]
    return f"peer snapshots need {need / 2**30:.2f} GiB of host memory on {name}, which has {free / 2**30:.2f} GiB free"


@dataclass(frozen=True)
class Holding:
    """What one surviving rank (old rank) holds after a loss: its live step (None: none, it exited), the steps of
    the copies of its own stage it kept, and the steps of the copies it received (of the stages it protects)."""

    live: int | None = None
    own: frozenset[int] = frozenset()
    received: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Recovery:
    """The newest complete step among the survivors' held steps, the committed snapshots and the checkpoint."""

    source: RecoverySource
    step: int
    steps_lost: int  # the newest step any rank completed, less ``step``


def stages_at(layout: Layout, plan: SnapshotPlan, holdings: Mapping[int, Holding], step: int) -> dict[int, bool]:
    """Per stage: is its state at ``step`` somewhere (True) and only in memory's live state (False: a snapshot
    is needed for it)? Stages held nowhere are absent."""
    out: dict[int, bool] = {}
    for rank, held in holdings.items():
        stage = layout.coords(rank)[1]
        if held.live == step:
            out[stage] = True
        elif step in held.own:
            out.setdefault(stage, False)
        if step in held.received:
            for sender in plan.senders_to(rank):
                out.setdefault(layout.coords(sender)[1], False)
    return out


def choose_recovery(
    layout: Layout, plan: SnapshotPlan, holdings: Mapping[int, Holding], checkpoint_step: int, newest_step: int
) -> Recovery:
    """The newest step newer than the checkpoint that every stage has somewhere among the survivors: from their
    live state alone (MEMORY, preferred at a tie) or with snapshots (SNAPSHOT); else the checkpoint. Steps lost
    count from ``newest_step`` (the newest any rank completed; never below the chosen step)."""
    steps = {h.live for h in holdings.values() if h.live is not None}
    steps |= {s for h in holdings.values() for s in h.own | h.received}
    for step in sorted((s for s in steps if s > checkpoint_step), reverse=True):
        covered = stages_at(layout, plan, holdings, step)
        if len(covered) == layout.pipeline_stages:
            source = RecoverySource.MEMORY if all(covered.values()) else RecoverySource.SNAPSHOT
            return Recovery(source, step, max(0, newest_step - step))
    return Recovery(RecoverySource.CHECKPOINT, checkpoint_step, max(0, newest_step - checkpoint_step))


def due(step: int, interval: int) -> bool:
    """A snapshot of ``step`` is taken at its boundary (``interval`` 0: never)."""
    return interval > 0 and step % interval == 0


def settled_interval(interval: int, cost_seconds: float, step_seconds: float, budget: float = SNAPSHOT_BUDGET) -> int:
    """The interval a generation keeps once it has timed its first snapshots: the job's ``interval`` where a
    snapshot costs at most ``budget`` of the steps between, else the fewest steps between at which it does.

    ``cost_seconds``: a snapshot's copy at the boundary (training waits for it) plus its stream (in the
    background, but on a CPU node it takes the cores the steps use): an upper bound of what it takes from
    training. Every rank settles on the slowest rank's cost and the fastest rank's step (one all-reduce), so
    the ranks, whose commits are collective, keep one interval."""
    if interval <= 0 or cost_seconds <= 0:
        return interval
    if step_seconds <= 0 or not math.isfinite(step_seconds) or not math.isfinite(cost_seconds):
        return interval
    return max(interval, math.ceil(cost_seconds / (budget * step_seconds) - 1e-9))


@dataclass(frozen=True)
class SnapshotCosts:
    """What a rank timed of its first snapshots: each one's copy plus stream, and its steps meanwhile."""

    snapshots: tuple[float, ...] = ()
    steps: tuple[float, ...] = ()

    def add_snapshot(self, seconds: float) -> SnapshotCosts:
        return SnapshotCosts((*self.snapshots, seconds), self.steps)

    def add_step(self, seconds: float) -> SnapshotCosts:
        return SnapshotCosts(self.snapshots, (*self.steps, seconds))

    @property
    def ready(self) -> bool:
        """Enough snapshots timed to settle the interval (and a step beside them)."""
        return len(self.snapshots) >= MEASURED_SNAPSHOTS and bool(self.steps)

    def figures(self) -> tuple[float, float]:
        """(the mean snapshot's seconds, the median step's seconds, its first left out where there are more)."""
        steps = self.steps[1:] or self.steps
        return statistics.fmean(self.snapshots), statistics.median(steps)


@dataclass(frozen=True)
class SnapshotVerdict:
    """What the planner says of a layout's peer snapshots: who sends to whom, the host bytes they hold per node,
    and why they are refused ("": they fit, or the nodes' host memory is not known)."""

    plan: SnapshotPlan
    per_node: Mapping[str, int]
    refusal: str = ""

    @property
    def notes(self) -> tuple[str, ...]:
        """The plan's notes about them (none where no stage needs a snapshot)."""
        if self.plan.unprotected:
            return (f"peer snapshots: {self.plan.unprotected}; a kill of it falls back to the checkpoint",)
        if self.refusal:
            return (f"peer snapshots refused: {self.refusal}; the job runs without",)
        if self.plan.active:
            most = max(self.per_node.values(), default=0)
            return (f"peer snapshots: {most / 2**30:.2f} GiB of host memory at most on a node",)
        return ()


def judge(layout: Layout, stage_bytes: Sequence[int], free_host_bytes: int | None) -> SnapshotVerdict:
    """The snapshots of ``layout`` against every node's free host memory (None: not known, never refused)."""
    plan = plan_snapshots(layout, stage_bytes)
    per_node = snapshot_memory(layout, plan, stage_bytes)
    free = {} if free_host_bytes is None else dict.fromkeys(per_node, free_host_bytes)
    return SnapshotVerdict(plan, per_node, snapshot_refusal(per_node, free) if plan.active else "")


def protection(layout: Layout | None, interval: int, morph_through_memory: bool) -> str:
    """What ``spotmorph status`` says of the peer snapshots of a job's layout: the stages they protect, or why a
    node's loss still loses a stage (too few nodes); "" where none are taken (none needed, or off)."""
    if layout is None or interval <= 0 or not morph_through_memory or not lonely_stages(layout):
        return ""
    plan = plan_snapshots(layout)
    if plan.unprotected:
        return (
            f"peer snapshots cannot protect this layout: {plan.unprotected}; a kill of it falls back to the checkpoint"
        )
    stages = ", ".join(str(r.stage) for r in plan.routes)
    return f"peer snapshots protect stage(s) {stages}: a kill without notice loses at most the steps between two"
