"""The controller's own events are typed: one dataclass per kind, its fields the event's data."""

from __future__ import annotations

import dataclasses

from controller.core.events import EventKind
from controller.core.model import RecordEvent, World
from controller.core.reconcile.draft import Draft
from controller.eventlog import facts
from controller.eventlog.fact import Fact


def every_fact() -> list[type[Fact]]:
    return [c for c in vars(facts).values() if isinstance(c, type) and issubclass(c, Fact) and "kind" in vars(c)]


def test_each_fact_names_its_own_kind() -> None:
    kinds = [cls.kind for cls in every_fact()]
    assert all(isinstance(kind, EventKind) for kind in kinds) and len(kinds) == len(set(kinds))
    for cls in every_fact():
        assert cls.optional <= {f.name for f in dataclasses.fields(cls)}, cls
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_a_fact_is_its_data_and_only_optional_nones_are_left_out() -> None:
    ended = facts.SalvageEnded(3, "stage_lost", stages_lost=[1], resume_step=40)
    assert ended.data() == {"generation": 3, "reason": "stage_lost", "stages_lost": [1], "resume_step": 40}
    progressed = facts.TrainingProgressed(2, 10, None, None)  # a None that is not optional stays
    assert progressed.data() == {"generation": 2, "step": 10, "loss": None, "samples_per_second": None}
    draft = Draft(World({}, {}), 7.0)
    draft.event(facts.NodesSuspected(4, ["node-2"]), "job-1")
    assert draft.commands == [
        RecordEvent(EventKind.NODES_SUSPECTED, 7.0, "job-1", None, {"generation": 4, "nodes": ["node-2"]})
    ]
