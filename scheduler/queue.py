"""The job queue's order: priority (higher first), then submission time, then id.

Shared by the controller's core (admission, :mod:`controller.core.reconcile.sharing`) and status. Who runs when
several jobs want the GPUs is the scheduler's (:func:`scheduler.policy.decide`: GPUs by priority-weighted value,
aging, a starvation bound, shrinks that pay), not the queue's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueEntry:
    job_id: str
    priority: int
    submitted_at: float


def admission_order(entries: Sequence[QueueEntry]) -> list[QueueEntry]:
    return sorted(entries, key=lambda e: (-e.priority, e.submitted_at, e.job_id))
