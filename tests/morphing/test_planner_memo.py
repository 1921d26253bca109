"""The planner remembers its answer per node list (the controller asks every pass), bounded, and a
remembered answer is the one a fresh planner gives."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from morphing import planner as planner_mod
from morphing.planner import Planner
from morphing.profile import parse_profile

GPT48 = parse_profile((Path(__file__).resolve().parents[2] / "examples" / "profiles" / "gpt48.json").read_text())


@settings(max_examples=25, deadline=None)
@given(slots=st.lists(st.integers(0, 8), min_size=1, max_size=6), stages=st.none() | st.integers(1, 4))
def test_a_remembered_plan_is_a_fresh_planners_plan(slots: list[int], stages: int | None) -> None:
    nodes = [(f"n{i}", s) for i, s in enumerate(slots)]
    warm = Planner(GPT48, 64)
    first = warm.plan(nodes, stages)
    assert warm.plan(list(nodes), stages) is first  # remembered: not planned again
    assert first == Planner(GPT48, 64).plan(nodes, stages)


def test_the_memory_is_bounded_and_keeps_the_newest() -> None:
    planner = Planner(GPT48, 64)
    for i in range(planner_mod.PLANS_REMEMBERED + 10):
        planner.plan([(f"n{i}", 1)])
    assert len(planner._plans) == planner_mod.PLANS_REMEMBERED
    newest = planner.plan([(f"n{planner_mod.PLANS_REMEMBERED + 9}", 1)])
    assert planner.plan([(f"n{planner_mod.PLANS_REMEMBERED + 9}", 1)]) is newest
