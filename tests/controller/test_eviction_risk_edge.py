"""Eviction risk at the edges: the heartbeat's ``risk`` is hostile input (refused naming the field, never an
observation), a good one is recorded once in the event log, and the store keeps a node's risk (schema 18)."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from controller.api import reports
from controller.core.commands import SetNode
from controller.core.lifecycle import NodeState
from controller.core.observations import EvictionRisk
from controller.core.records import AtRisk
from controller.persistence.codec import node_to_dict
from controller.persistence.store import Store
from morphing.validation import InvalidField
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.helpers import node
from tests.controller.test_hostile_edge import INVALID, Node, node_state, refusal
from tests.controller.test_store import stored_at

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("noticed_at", "source", "field", "words"),
    [
        (math.nan, "aws", "risk.noticed_at", "not a time"),
        (math.inf, "aws", "risk.noticed_at", "not a time"),
        (-1.0, "aws", "risk.noticed_at", "not a time"),
        (NOW + 3600, "aws", "risk.noticed_at", "after the controller's clock"),
        (NOW, "x" * 129, "risk.source", "at most 128"),
        (NOW, "aws\x1b[2J", "risk.source", "control character"),
    ],
)
def test_a_hostile_risk_is_refused_naming_its_field(noticed_at: float, source: str, field: str, words: str) -> None:
    with pytest.raises(InvalidField, match=words) as info:
        reports.risk(pb.EvictionRisk(noticed_at=noticed_at, source=source), NOW)
    assert str(info.value).startswith(f"{field}:")


def test_a_risk_within_the_clock_skew_is_taken_as_it_was_said() -> None:
    said = pb.EvictionRisk(noticed_at=NOW + 60, source="azure-scheduled-events")
    assert reports.risk(said, NOW) == EvictionRisk(NOW + 60, "azure-scheduled-events")
    assert reports.risk(pb.EvictionRisk(noticed_at=NOW), NOW) == EvictionRisk(NOW, "")


def test_a_heartbeat_with_a_hostile_risk_is_invalid_and_a_good_one_is_noticed_once(live: Live) -> None:
    node = Node(live)
    node.beat()
    for risk in (pb.EvictionRisk(noticed_at=math.nan, source="aws"), pb.EvictionRisk(source="a\0b")):
        code, detail = refusal(partial(node.beat, risk=risk))
        assert code == INVALID and detail.startswith("risk.")
    assert node_state(live, node.name) == pb.NODE_STATE_READY
    risk = pb.EvictionRisk(noticed_at=time.time(), source="aws-rebalance-recommendation")
    for _ in range(3):
        node.beat(risk=risk)
    node.beat()
    node.beat()
    said = [e for e in live.jobs().WatchEvents(pb.WatchEventsRequest(), timeout=5) if "Risk" in e.kind]
    assert [(e.kind, e.node) for e in said] == [
        ("EvictionRiskNoticed", node.name),
        ("EvictionRiskWithdrawn", node.name),
    ]
    assert node_state(live, node.name) == pb.NODE_STATE_READY


def test_schema_18_gives_a_version_17_node_row_no_risk_and_keeps_a_risk_it_was_given(tmp_path: Path) -> None:
    kept = node("node-1", NodeState.READY)
    row = {k: v for k, v in node_to_dict(kept).items() if k != "at_risk"}
    stored = stored_at(tmp_path, 17, "INSERT INTO nodes VALUES ('node-1', 1, 'READY', :data)", row)
    assert stored.load()[0]["node-1"] == kept
    at_risk = replace(kept, at_risk=AtRisk(EvictionRisk(12.5, "local"), since=13.0, moved_at=14.0))
    stored.persist([SetNode(at_risk)])
    stored.close()
    reopened = Store(tmp_path / "v17.db")
    assert reopened.load()[0]["node-1"] == at_risk
    reopened.close()
