"""What each QUEUED job waits for, in the words ``spotmorph status`` shows.

A job that fits no layout of the nodes present (its profile needs more memory than they have, it needs GPU nodes
and none registered, every node is held out for it) says why and holds nothing back. With several jobs live the
scheduler's grants decide who runs (:mod:`~controller.core.reconcile.sharing`): a job waits for nodes granted to it
that a shrinking job still holds, or for a share of the GPUs. Otherwise it waits for arrivals to settle, or for
nodes to be freed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.core.lifecycle import JobState, NodeState
from controller.core.model import JobRecord
from controller.core.reconcile.config import Planners
from controller.core.reconcile.devices import NO_FREE_GPU_NODE, needs_gpus, waiting_reason
from controller.core.reconcile.draft import Draft, free_nodes
from controller.core.reconcile.generation import planned, usable_nodes
from controller.core.reconcile.unreachable import held_out
from morphing.planner import Infeasible, Plan, Planner

WAITS_FOR_ROOM = "waits for nodes to be freed: it fits the nodes here, not the free ones"
WAITS_FOR_ARRIVALS = "waits for recent node arrivals to settle before it is placed"
NO_NODES = "waits for nodes: none is ready"


def present_nodes(draft: Draft) -> list[tuple[str, int]]:
    """Nodes a queued job could be placed on once running jobs free them, oldest first."""
    present = [n for n in draft.nodes.values() if n.state in (NodeState.READY, NodeState.ASSIGNED)]
    return [(n.name, n.slots) for n in sorted(present, key=lambda n: (n.joined_at, n.name))]


def unplaceable(draft: Draft, planners: Planners, job: JobRecord, nodes: Sequence[tuple[str, int]]) -> str | None:
    """Why ``job`` fits no layout of ``nodes``; None when one fits."""
    usable = usable_nodes(draft, job, nodes)
    if not usable:
        held = [name for name, _ in nodes if held_out(job, name, draft.now)]
        if held:
            return f"every node here it may use is held out for it after failures ({', '.join(held[:5])})"
        return waiting_reason(job, draft.nodes) or NO_NODES
    planner = planners.get(job.id)
    if not isinstance(planner, Planner):
        return planner.reason if planner is not None else "no planner"
    result = planned(draft, job.id, planner.plan, usable)
    gpus = sum(slots for _, slots in usable)
    if isinstance(result, Infeasible):
        return f"fits no layout of the {len(usable)} node(s) here ({gpus} GPU slots): {result.reason}"
    if isinstance(result, Plan) and result.gpus_used < job.spec.min_gpus:
        return (
            f"its best layout on the {len(usable)} node(s) here uses {result.gpus_used} GPU(s), fewer than its "
            f"min_gpus {job.spec.min_gpus}"
        )
    return None if isinstance(result, Plan) else "planning failed"


class Placement:
    """Whether each queued job fits the nodes present, asked of its planner at most once a pass."""

    def __init__(self, draft: Draft, planners: Planners) -> None:
        self.draft, self.planners, self.nodes = draft, planners, present_nodes(draft)
        self._problems: dict[str, str | None] = {}

    def problem(self, job_id: str) -> str | None:
        if job_id not in self._problems:
            job = self.draft.jobs[job_id]
            self._problems[job_id] = unplaceable(self.draft, self.planners, job, self.nodes)
        return self._problems[job_id]


def explain_waits(
    draft: Draft, placement: Placement, settled: bool, waiting: Mapping[str, str], no_share: str | None = None
) -> None:
    """Give every job still QUEUED its reason (a new one only when it changed): why it fits no layout here; the
    nodes granted to it that a shrinking job still holds (``waiting``); the arrivals it waits to settle; a share of
    the GPUs (``no_share``, while the scheduler shares them: free nodes it could use went to others); or nodes to
    be freed (none free it may use)."""
    free = [(n.name, n.slots) for n in free_nodes(draft.nodes)]
    for job in [j for j in draft.jobs.values() if j.state is JobState.QUEUED]:
        no_room = NO_FREE_GPU_NODE if needs_gpus(job.spec) else WAITS_FOR_ROOM
        wait = no_share if no_share is not None and usable_nodes(draft, job, free) else no_room
        reason = placement.problem(job.id) or waiting.get(job.id) or (wait if settled else WAITS_FOR_ARRIVALS)
        if reason != job.reason:
            draft.move_job(job.id, JobState.QUEUED, reason)
