"""Events are typed from writer to reader: every kind has its fact, every fact survives the log, bad data is refused.

A field renamed on the writing side must break here, not in a picture: the readers (the timeline, the dashboard,
the demo, the harness) decode the same classes the writers build, and the store's own events decode too.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest

from controller.core.causes import MorphCause
from controller.core.changes import act, move
from controller.core.lifecycle import JobState
from controller.core.model import Action
from controller.core.records import Morph
from controller.eventlog import facts
from controller.eventlog.fact import EventDataError, Fact
from controller.eventlog.kinds import EventKind
from controller.eventlog.schema import Logged, decode, fact_classes, logged
from controller.persistence.store import Store
from tests.controller.test_store import _running_world


def sample(hint: Any, none: bool) -> Any:
    """A value of type ``hint`` (None for a nullable one when ``none``), as a writer would give it."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        return None if none else sample(next(a for a in args if a is not type(None)), none)
    if origin is list:
        return [sample(args[0], none), sample(args[0], none)]
    if origin is dict:
        return {"index": 0, "name": "H100", "memory_bytes": 2**36}
    if dataclasses.is_dataclass(hint):
        return build(hint, none)  # type: ignore[arg-type]
    return {int: 7, float: 2.5, str: "node-3 lost"}[hint]


def build(cls: type[Fact], none: bool) -> Fact:
    hints = get_type_hints(cls)
    return cls(**{f.name: sample(hints[f.name], none) for f in dataclasses.fields(cls)})


def through_the_log(fact: Fact) -> Any:
    """The data of ``fact`` as a reader gets it: recorded, then through JSON (the store's column, the API)."""
    return json.loads(json.dumps(dict(fact.recorded(1.0, "job-1").data)))


def test_every_event_kind_has_a_fact_that_names_it() -> None:
    classes = fact_classes()
    assert set(classes) == set(EventKind)
    assert all(cls.kind is kind for kind, cls in classes.items())
    for cls in classes.values():
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert cls.optional <= {f.name for f in dataclasses.fields(cls)}, cls


@pytest.mark.parametrize("none", [False, True], ids=["values", "nones"])
@pytest.mark.parametrize("kind", list(EventKind))
def test_every_fact_round_trips_through_its_event_data(kind: EventKind, none: bool) -> None:
    fact = build(fact_classes()[kind], none)
    assert decode(kind, through_the_log(fact)) == fact


def test_state_changes_keep_from_and_to_in_their_data() -> None:
    action = facts.JobActionChanged("RUN", "STOP", "a planned morph", "eviction notice")
    moved = facts.JobStateChanged("RUNNING", "MORPHING", "a morph", "eviction notice", action)
    data = through_the_log(moved)
    assert data["from"] == "RUNNING" and data["action"]["to"] == "STOP" and "source" not in data
    assert "action" not in through_the_log(dataclasses.replace(moved, action=None))


# Data as older logs hold it, literally (a field renamed in its fact breaks these, as it would break reading those
# logs): what a row lacks, written before the field existed, decodes to the field's default.
OLD_ROWS = [
    (
        {"generation": 2, "layout": "1x2 (P x D), m=4", "resume_step": 40, "cause": "eviction of node-2"},
        facts.GenerationIssued(2, "1x2 (P x D), m=4", 40, "eviction of node-2"),
    ),
    (
        {"generation": 2, "step": 41, "pause_seconds": 3.5, "decision_seconds": 0.2, "paused_since": 10.0,
         "resumed_at": 13.5},
        facts.TrainingResumed(2, 41, 3.5, 0.2, 10.0, 13.5, stalled_seconds=None),
    ),
    (
        {"generation": 2, "held_step": 44, "resume_step": 40, "reason": "a stage was lost"},
        facts.HeldStateSkipped(2, 44, 40, "a stage was lost", cause=None),
    ),
    ({"incarnation": 1, "slots": 4, "address": "10.0.0.3:7000"}, facts.NodeRegistered(1, 4, "10.0.0.3:7000", [])),
    (
        {"from": "QUEUED", "to": "RUNNING", "cause": "admitted", "reason": "generation 1"},
        facts.JobStateChanged("QUEUED", "RUNNING", "admitted", "generation 1", action=None),
    ),
    ({"generation": 3, "reason": "no_step"}, facts.SalvageEnded(3, "no_step")),
]  # fmt: skip


@pytest.mark.parametrize(("data", "fact"), OLD_ROWS, ids=lambda x: type(x).__name__ if isinstance(x, Fact) else "")
def test_old_rows_missing_a_newer_field_still_decode(data: dict[str, Any], fact: Fact) -> None:
    assert decode(fact.kind, data) == fact
    assert decode(fact.kind, through_the_log(fact)) == fact


@pytest.mark.parametrize(
    ("kind", "data", "named"),
    [
        ("GenerationIssued", {"generation": 2, "layout": "1x2", "resume_step": "40", "cause": "x"}, "resume_step"),
        ("GenerationIssued", {"generation": 2, "layout": "1x2", "cause": "x"}, "no field resume_step"),
        ("CheckpointCommitted", {"generation": True, "step": 40}, "generation"),
        ("TrainingProgressed", {"generation": 1, "step": 4, "loss": "low", "samples_per_second": None}, "loss"),
        ("NodesSuspected", {"generation": 1, "nodes": ["node-1", 2]}, "nodes[1]"),
        ("JobStateChanged", {"from": "A", "to": "B", "cause": "c", "reason": "r", "action": {"from": "X"}}, "action"),
        ("NodeRegistered", [1, 2], "expected an object"),
        ("EvaluationCompleted", {"generation": 1, "step": 4, "loss": None}, "loss"),
    ],
)
def test_data_of_the_wrong_shape_is_refused_naming_the_kind_and_the_field(kind: str, data: Any, named: str) -> None:
    with pytest.raises(EventDataError, match=f"{kind} event.*{re.escape(named)}"):
        decode(kind, data)


def test_an_unknown_kind_is_refused_and_unknown_keys_are_ignored() -> None:
    with pytest.raises(EventDataError, match="'JobTeleported': no kind of event"):
        decode("JobTeleported", {})
    newer = {"generation": 3, "step": 60, "written_by": "a newer controller"}
    assert decode("CheckpointCommitted", newer) == facts.CheckpointCommitted(3, 60)


def test_every_event_the_store_writes_decodes(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    world = _running_world(store)
    running = world.jobs["job-1"]
    morphing = move(running, JobState.MORPHING, "notice", 2.0, action=Action.STOP, morph=Morph(cause=MorphCause.GROW))
    store.persist([morphing, act(morphing.job, Action.ABORT, "stop timed out", 3.0)])
    rows = store.events()
    decoded = [decode(row.kind, row.data) for row in rows]
    assert {type(f) for f in decoded} >= {facts.JobSubmitted, facts.NodeStateChanged, facts.GenerationIssued}
    issued = next(f for f in decoded if isinstance(f, facts.GenerationIssued))
    assert (issued.generation, issued.resume_step, issued.morph_cause) == (1, 0, "admitted")
    moved, acted = decoded[-2:]
    assert isinstance(moved, facts.JobStateChanged) and moved.action is not None
    assert (moved.target, moved.action.source, moved.action.target, moved.action.reason) == (
        "MORPHING",
        "RUN",
        "STOP",
        "notice",
    )
    assert isinstance(acted, facts.JobActionChanged) and (acted.source, acted.target) == ("STOP", "ABORT")


def test_a_reader_gets_the_events_of_one_fact_with_their_envelope() -> None:
    rows = [
        {"seq": 4, "at": 2.0, "kind": "CheckpointCommitted", "job": "job-1", "node": None, "data": {"generation": 1,
         "step": 20}, "decision": 9},
        {"seq": 5, "at": 3.0, "kind": "EvictionNoticed", "job": None, "node": "node-2", "data": {"not_before": None}},
    ]  # fmt: skip
    assert logged(rows, facts.CheckpointCommitted) == [
        Logged(2.0, "job-1", None, facts.CheckpointCommitted(1, 20), 4, 9)
    ]
    [notice] = logged(rows, facts.EvictionNoticed)
    assert (notice.node, notice.fact.not_before, notice.decision) == ("node-2", None, None)
