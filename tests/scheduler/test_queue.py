"""The queue's order: priority, then submission time, then id."""

from __future__ import annotations

from scheduler.queue import QueueEntry, admission_order


def test_order_is_priority_then_time_then_id() -> None:
    entries = [QueueEntry("b", 0, 1.0), QueueEntry("a", 0, 1.0), QueueEntry("c", 5, 9.0), QueueEntry("d", 0, 0.5)]
    assert [e.job_id for e in admission_order(entries)] == ["c", "d", "a", "b"]
