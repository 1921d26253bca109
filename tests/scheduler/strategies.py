"""Hypothesis strategies for the scheduler: throughput curves, jobs and nodes."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from scheduler.jobs import Grant, JobView, Node
from scheduler.pools import PoolKind


@st.composite
def curves(draw: st.DrawFn, max_gpus: int = 12) -> tuple[float, ...]:
    """A non-decreasing samples/s curve that starts at 0, maybe with a minimum GPU count and plateaus."""
    top = draw(st.integers(1, max_gpus))
    start = draw(st.integers(1, top))
    steps = draw(st.lists(st.floats(0.0, 50.0), min_size=top - start + 1, max_size=top - start + 1))
    steps[0] = max(steps[0], 1.0)
    return (0.0,) * start + tuple(itertools.accumulate(steps))


@st.composite
def jobs(draw: st.DrawFn, count: int = 4) -> list[JobView]:
    n = draw(st.integers(1, count))
    return [
        JobView(
            name=f"j{i}",
            rates=draw(curves()),
            remaining_samples=draw(st.floats(1.0, 1e6)),
            priority=draw(st.integers(0, 3)),
            waited_seconds=draw(st.sampled_from([0.0, 600.0, 8000.0])),
        )
        for i in range(n)
    ]


@st.composite
def spot_nodes(draw: st.DrawFn) -> list[Node]:
    sizes = draw(st.lists(st.integers(0, 8), min_size=0, max_size=6))
    return [Node(f"n{i}", PoolKind.SPOT, gpus) for i, gpus in enumerate(sizes)]


@st.composite
def holdings(draw: st.DrawFn, views: list[JobView], nodes: list[Node]) -> list[JobView]:
    """The jobs holding some GPUs of the nodes (maybe of nodes since gone), never more than a node has."""
    free = {n.name: n.gpus for n in nodes}
    out = []
    for job in views:
        held = []
        for node in draw(st.lists(st.sampled_from([*free, "gone"]), max_size=3, unique=True)) if free else []:
            take = draw(st.integers(0, free.get(node, 2)))
            if take:
                held.append(Grant(job.name, node, PoolKind.SPOT, take))
                free[node] = free.get(node, 2) - take if node in free else 0
        out.append(JobView(**{**job.__dict__, "held": tuple(held)}))
    return out


@st.composite
def eligibility(draw: st.DrawFn, views: list[JobView], nodes: list[Node]) -> list[JobView]:
    """Each job may use any node (None), or only some of those present (and maybe names of nodes not here)."""
    names = [n.name for n in nodes] + ["elsewhere"]
    out = []
    for job in views:
        chosen = draw(st.none() | st.frozensets(st.sampled_from(names)))
        out.append(JobView(**{**job.__dict__, "eligible_nodes": chosen}))
    return out
