"""What each QUEUED job waits for, in the words ``spotmorph status`` shows, and which waits block the queue.

With several jobs live the scheduler's grants decide who runs (:func:`explain_shared_waits`); with one, the rule
below.

A job that fits the nodes present (READY or ASSIGNED: nodes that a running job could free) but not the
free ones waits for nodes to be freed, and, with no backfill, so does every job behind it. A job that
fits no layout of the nodes present (its profile needs more memory than they have, it needs GPU nodes
and none registered, every node is held out for it) waits for other nodes to arrive and blocks nobody:
jobs behind it that fit are admitted, and running jobs may grow.
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
from scheduler.queue import QueueEntry, admission_order

WAITS_FOR_ROOM = "waits for nodes to be freed: it fits the nodes here, not the free ones"
WAITS_FOR_ARRIVALS = "waits for recent node arrivals to settle before it is placed"
NO_NODES = "waits for nodes: none is ready"


def behind(head: str) -> str:
    return f"waits behind {head}, ahead of it in the queue (priority, then submission time)"


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

    def fits(self, job_id: str) -> bool:
        return self.problem(job_id) is None


def explain_waits(draft: Draft, placement: Placement, settled: bool) -> None:
    """Give every job still QUEUED its reason (a new one only when it changed), and mark the queue blocked
    when one of them fits the nodes present: the head of those waits for room, the others behind it."""
    queued = [j for j in draft.jobs.values() if j.state is JobState.QUEUED]
    head: str | None = None
    for entry in admission_order([QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in queued]):
        job = draft.jobs[entry.job_id]
        problem = placement.problem(job.id)
        if problem is not None:
            reason = problem
        elif head is None:
            head = job.id
            reason = WAITS_FOR_ARRIVALS if not settled else NO_FREE_GPU_NODE if needs_gpus(job.spec) else WAITS_FOR_ROOM
        else:
            reason = behind(head)
        if reason != job.reason:
            draft.move_job(job.id, JobState.QUEUED, reason)
    draft.queue_blocked = head is not None


def explain_shared_waits(
    draft: Draft, placement: Placement, settled: bool, waiting: Mapping[str, str], no_share: str
) -> None:
    """Reasons while the scheduler shares the GPUs (:mod:`~controller.core.reconcile.sharing`): a job that fits no
    layout here says why; one granted nodes still held waits for them (``waiting``); the others wait for a share
    (``no_share``) when free nodes it could use went to others, or for nodes to be freed when none is free. Nothing
    blocks the queue: the grants decide."""
    free = [(n.name, n.slots) for n in free_nodes(draft.nodes)]
    for job in [j for j in draft.jobs.values() if j.state is JobState.QUEUED]:
        no_room = NO_FREE_GPU_NODE if needs_gpus(job.spec) else WAITS_FOR_ROOM
        wait = no_share if usable_nodes(draft, job, free) else no_room
        reason = placement.problem(job.id) or waiting.get(job.id) or (wait if settled else WAITS_FOR_ARRIVALS)
        if reason != job.reason:
            draft.move_job(job.id, JobState.QUEUED, reason)
