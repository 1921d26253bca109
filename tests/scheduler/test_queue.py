"""Admission policy: priority, then submission order; the head blocks the jobs behind it (no backfill)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.queue import QueueEntry, admission_order, admit


def _fit_needing(sizes: dict[str, int]):  # type: ignore[no-untyped-def]
    def fit(job_id: str, nodes: Sequence[tuple[str, int]]) -> tuple[str, frozenset[str]] | None:
        need = sizes[job_id]
        if len(nodes) < need:
            return None
        return f"plan-{job_id}", frozenset(n for n, _ in nodes[:need])

    return fit


def test_order_is_priority_then_time_then_id() -> None:
    entries = [QueueEntry("b", 0, 1.0), QueueEntry("a", 0, 1.0), QueueEntry("c", 5, 9.0), QueueEntry("d", 0, 0.5)]
    assert [e.job_id for e in admission_order(entries)] == ["c", "d", "a", "b"]


def test_jobs_take_disjoint_nodes_in_order() -> None:
    entries = [QueueEntry("a", 1, 0.0), QueueEntry("b", 0, 0.0)]
    nodes = [("n1", 1), ("n2", 1), ("n3", 1)]
    assert admit(entries, nodes, _fit_needing({"a": 2, "b": 1})) == [("a", "plan-a"), ("b", "plan-b")]


def test_no_backfill_past_a_head_that_does_not_fit() -> None:
    entries = [QueueEntry("big", 1, 0.0), QueueEntry("small", 0, 0.0)]
    assert admit(entries, [("n1", 1)], _fit_needing({"big": 2, "small": 1})) == []


def test_nothing_free_admits_nothing() -> None:
    assert admit([QueueEntry("a", 0, 0.0)], [], _fit_needing({"a": 1})) == []
