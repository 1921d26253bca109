"""Each decision records what triggered it (controller.core.stimulus): an agent's call with its node and
incarnation, an operator's call with the job, a timer; `spotmorph events` shows it beside the decision."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from controller.core.stimulus import Stimulus, StimulusKind
from controller.eventlog import facts
from controller.persistence.store import MIGRATIONS, SCHEMA_VERSION, Store, migrate
from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.cli import main
from tests.controller.conftest import Live
from tests.controller.test_contract import spec


def _events(live: Live, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    client = ["--controller", live.address, "--token", live.token("operator")]
    assert main(["events", "--json", *args, *client]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _changed(rows: list[dict[str, Any]], kind: str, to: str) -> dict[str, Any]:
    return next(r for r in rows if r["kind"] == kind and r["data"].get("to") == to)


def test_a_call_records_its_node_and_incarnation_or_its_job_and_caller(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    job = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id
    agent = live.agent(live.agent_token())
    agent.Register(pb.RegisterRequest(node_name="node-7", slots=1, address="127.0.0.1"))
    again = agent.Register(pb.RegisterRequest(node_name="node-7", slots=1, address="127.0.0.1"))
    assert again.incarnation == 2
    node = live.agent(again.node_token)
    node.Heartbeat(pb.HeartbeatRequest(node_name="node-7", incarnation=2))  # READY, and the job is admitted
    commit = pb.CheckpointCommitted(job=job, generation=1, step=3)
    node.ReportEvent(pb.ReportEventRequest(node_name="node-7", incarnation=2, checkpoint_committed=commit))
    live.jobs().CancelJob(pb.CancelJobRequest(id=job))
    rows = _events(live, capsys)
    submitted = next(r for r in rows if r["kind"] == "JobSubmitted")
    assert submitted["stimulus"] == {
        "kind": "job_call", "source": "SubmitJob", "node": None, "job": job, "caller": "operator", "incarnation": None
    }  # fmt: skip
    registered = [r["stimulus"] for r in rows if r["kind"] == "NodeRegistered"]
    assert [(s["source"], s["node"], s["incarnation"], s["caller"]) for s in registered] == [
        ("Register", "node-7", None, "agent"),
        ("Register", "node-7", None, "agent"),
    ]
    ready = _changed(rows, "NodeStateChanged", "READY")["stimulus"]
    assert (ready["kind"], ready["source"], ready["node"], ready["incarnation"]) == (
        "node_call",
        "Heartbeat",
        "node-7",
        2,
    )
    issued = next(r for r in rows if r["kind"] == "GenerationIssued")
    assert issued["decision"] == _changed(rows, "NodeStateChanged", "READY")["decision"]
    assert issued["stimulus"] == ready  # the heartbeat's decision admitted the job too
    committed = next(r for r in rows if r["kind"] == "CheckpointCommitted")["stimulus"]
    assert (committed["source"], committed["node"], committed["incarnation"], committed["job"]) == (
        "ReportEvent",
        "node-7",
        2,
        job,
    )
    cancelled = _changed(rows, "JobStateChanged", "CANCELLED")["stimulus"]
    assert (cancelled["source"], cancelled["job"], cancelled["caller"]) == ("CancelJob", job, "operator")
    client = ["--controller", live.address, "--token", live.token("operator")]
    assert main(["events", "--decision", str(issued["decision"]), *client]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.endswith("<- Heartbeat node-7#2") for line in lines), lines


def test_a_timer_triggered_decision_records_the_timer(live_clock: Live, capsys: pytest.CaptureFixture[str]) -> None:
    """node-1 stops beating; the heartbeat-expiry timer's decision finds it LOST (the daemon's own timer)."""
    assert live_clock.clock is not None
    reg = live_clock.agent(live_clock.agent_token()).Register(pb.RegisterRequest(slots=1, address="127.0.0.1"))
    live_clock.agent(reg.node_token).Heartbeat(pb.HeartbeatRequest(node_name=reg.node_name, incarnation=1))
    live_clock.clock.at += 60.0  # past the heartbeat expiry: the next expiry tick (every second) decides
    deadline = time.monotonic() + 10
    while not (lost := [r for r in _events(live_clock, capsys) if r["data"].get("to") == "LOST"]):
        assert time.monotonic() < deadline, "no decision found the node LOST"
        time.sleep(0.2)
    assert lost[0]["stimulus"] == {
        "kind": "tick", "source": "heartbeat-expiry", "node": None, "job": None, "caller": None, "incarnation": None
    }  # fmt: skip
    client = ["--controller", live_clock.address, "--token", live_clock.token("operator")]
    assert main(["events", "--decision", str(lost[0]["decision"]), *client]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("<- tick heartbeat-expiry")


def _kept_per_decision(store: Store) -> None:
    """A decision nobody named the trigger of has none; a named one keeps it, read back with its events."""
    store.persist([facts.DecisionsResumed().recorded(1.0)])
    heartbeat = Stimulus.node_call("Heartbeat", "node-3", 4)
    decision = store.persist([facts.ReportRefused("why").recorded(2.0, node="node-3")], heartbeat)
    first, second = store.events()
    assert (first.stimulus, second.stimulus, second.decision) == (None, heartbeat, decision)
    assert store.recent_events(None, None, 1)[0].stimulus == heartbeat
    assert heartbeat.kind is StimulusKind.NODE_CALL and heartbeat.caller == "node"


def test_the_stimulus_is_kept_per_decision(store_target: Path | str) -> None:
    _kept_per_decision(Store(store_target))


def test_decisions_before_schema_14_have_none(tmp_path: Path) -> None:
    """SQLite only: a database of schema 13 exists only as a SQLite file (PostgreSQL came with schema 17)."""
    path = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{path}")
    migrate(engine, MIGRATIONS[:13])
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE decisions"))  # as a controller of schema 13 left it
    engine.dispose()
    old = Store(path)
    assert old.schema_version() == SCHEMA_VERSION >= 14
    _kept_per_decision(old)
