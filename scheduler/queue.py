"""The job queue and the admission policy for several jobs on one cluster.

Policy (documented in docs/controller.md; pure, so the controller's core and the multi-job replay share it):

- Queued jobs are ordered by priority (higher first), then submission time, then id.
- The head of the queue is admitted as soon as a layout with at least ``min_gpus`` GPUs fits on the
  free nodes (READY and held by no job); it takes the nodes its plan uses, the next job is then
  considered on what is left.
- No backfill: when the head does not fit the free nodes but fits the nodes present (some held by
  running jobs), the jobs behind it wait, so a large job is never starved by a stream of small ones.
  A job that fits no layout of the nodes present at all (``placeable`` says so) blocks nobody: the jobs
  behind it are considered as if it were not there. Running jobs are never preempted for a queued one.
- A running job grows onto free nodes only when no placeable job is waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar


@dataclass(frozen=True)
class QueueEntry:
    job_id: str
    priority: int
    submitted_at: float


def admission_order(entries: Sequence[QueueEntry]) -> list[QueueEntry]:
    return sorted(entries, key=lambda e: (-e.priority, e.submitted_at, e.job_id))


P = TypeVar("P")


def admit(
    entries: Sequence[QueueEntry],
    free_nodes: Sequence[tuple[str, int]],
    fit: Callable[[str, Sequence[tuple[str, int]]], tuple[P, frozenset[str]] | None],
    placeable: Callable[[str], bool] = lambda _: True,
) -> list[tuple[str, P]]:
    """Jobs to start now, in order, each with the plan ``fit`` made for it on the nodes still free.

    ``fit(job_id, nodes)`` returns the plan and the node names it uses, or ``None`` when nothing fits;
    ``placeable(job_id)`` whether the job fits the cluster's nodes at all (free or not).
    """
    free = list(free_nodes)
    admitted: list[tuple[str, P]] = []
    for entry in admission_order(entries):
        if not free:
            break
        result = fit(entry.job_id, free)
        if result is None:
            if placeable(entry.job_id):
                break  # no backfill: the head waits for room and so does everyone behind it
            continue  # it fits none of the nodes here: it waits for others without blocking the queue
        plan, used = result
        admitted.append((entry.job_id, plan))
        free = [n for n in free if n[0] not in used]
    return admitted
