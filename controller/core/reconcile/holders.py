"""The nodes a morph through memory has to keep: the next generation takes the stopped step from the old
trainers' memory only if its ranks hold every layer between them. A holder left out takes its layers with it,
and the next generation falls back to the newest committed checkpoint, losing the steps since (exact, but
lost). The planner places ranks on nodes in the order it is given and may use fewer than it is offered (a
smaller layout is as fast, or faster), so the holders go first and, when the best layout is still too small
to reach them, the best one that does is taken instead unless it is much slower (:func:`prefer_holders`).
"""

from __future__ import annotations

from collections.abc import Sequence

from morphing.layout import Layout
from morphing.plan_result import Plan

SLOWER_AT_MOST = 1.25
"""How much longer a step of the best layout that keeps the holders may be predicted to take than one of the
best layout: it runs until the next morph, where the steps lost without the holders are lost once (at most a
checkpoint interval's), so only a small slowdown is worth them."""


def holders_to_keep(layout: Layout, kept: Sequence[str], handed_off: bool) -> tuple[str, ...]:
    """The nodes of ``kept`` (in its order) the next generation must include so that its ranks hold every layer
    of ``layout`` (the old generation's) at the stop; empty when no choice of them does.

    A stage with a rank on a kept node is held there (a replica is as good as another: nodes are taken
    greedily, the one holding the most stages not yet held first, at most one per stage). A stage with none
    was handed off at the stop when ``handed_off`` (an eviction notice: the leaving ranks send their layers
    to staying ones, balanced by bytes, so any kept node may hold some: all are needed), and is lost
    otherwise (a node killed without notice: memory cannot give it, nothing to keep)."""
    stages_on: dict[str, set[int]] = {name: set() for name in kept}
    for rank, slot in enumerate(layout.placement):
        if slot.node in stages_on:
            stages_on[slot.node].add(layout.coords(rank)[1])
    held = set().union(*stages_on.values())
    if len(held) < layout.pipeline_stages:
        return tuple(kept) if handed_off and held else ()
    chosen: list[str] = []
    missing = set(held)
    while missing:
        best = max(kept, key=lambda name: (len(stages_on[name] & missing), -kept.index(name)))
        chosen.append(best)
        missing -= stages_on[best]
    return tuple(name for name in kept if name in chosen)


def prefer_holders(best: Plan, keeping: Plan | None) -> Plan:
    """``keeping`` (the best layout that reaches the holders) unless there is none or its predicted step is
    more than :data:`SLOWER_AT_MOST` times ``best``'s."""
    if keeping is None or keeping.predicted_step_seconds > best.predicted_step_seconds * SLOWER_AT_MOST:
        return best
    return keeping
