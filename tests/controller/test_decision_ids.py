"""Why did that happen: every event names the decision (one committed reconcile pass) that wrote it, and
`spotmorph events --decision N` shows what one decision did, through a real controller."""

from __future__ import annotations

import json

import pytest

from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.cli import main
from tests.controller.conftest import Live
from tests.controller.test_contract import spec


def test_spotmorph_events_shows_and_filters_by_decision(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = live.jobs()
    first = jobs.SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id
    second = jobs.SubmitJob(
        pb.SubmitJobRequest(spec=spec(live, name="other", checkpoint_dir=f"{live.state_dir}/c2"))
    ).id
    client = ["--controller", live.address, "--token", live.token("operator")]
    assert main(["events", "--json", *client]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    submitted = {row["job"]: row["decision"] for row in rows if row["kind"] == "JobSubmitted"}
    assert set(submitted) == {first, second} and submitted[first] < submitted[second]
    assert main(["events", "--decision", str(submitted[second]), *client]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(f" d{submitted[second]} " in line for line in lines), lines
    assert any("JobSubmitted" in line and second in line for line in lines)
    assert not any(first in line for line in lines), "another decision's events are left out"
    for bad in ("-1", "x", str(2**64)):
        assert main(["events", "--decision", bad, *client]) == 2
        assert "--decision" in capsys.readouterr().err
