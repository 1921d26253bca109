from __future__ import annotations

import json
from pathlib import Path

from .test_plan_cli import ROOT, spotmorph

TRACE = ROOT / "examples" / "traces" / "aws-p3-spot.csv"
PROFILE = ROOT / "examples" / "profiles" / "gpt48.json"


def test_simulate_json_reports_every_policy() -> None:
    out = spotmorph("simulate", "--trace", str(TRACE), "--profile", str(PROFILE), "--global-batch", "512", "--json")
    assert out.returncode == 0, out.stderr
    policies = json.loads(out.stdout)["policies"]
    assert set(policies) == {"spotmorph", "fixed-pipeline-restart", "data-parallel-only", "oracle"}
    for row in policies.values():
        for key in ("goodput_vs_oracle", "samples", "morphs", "steps_lost", "gpu_hours", "cost_spot"):
            assert key in row
    assert policies["oracle"]["goodput_vs_oracle"] == 1.0


def test_simulate_table_and_bad_input(tmp_path: Path) -> None:
    table = spotmorph("simulate", "--trace", str(TRACE), "--profile", str(PROFILE), "--global-batch", "64")
    assert table.returncode == 0
    assert "goodput" in table.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,a\nten,remove,a\n")
    cases = [
        (["--trace", str(tmp_path / "none.csv")], "cannot be read"),
        (["--trace", str(bad)], "line 2"),
        (["--trace", str(TRACE), "--morph-cost-seconds", "-1"], "--morph-cost-seconds"),
        (["--trace", str(TRACE), "--gpus-per-node", "0"], "--gpus-per-node"),
    ]
    for args, expected in cases:
        out = spotmorph("simulate", *args, "--profile", str(PROFILE), "--global-batch", "64")
        assert out.returncode == 2, args
        assert expected in out.stderr
        assert "Traceback" not in out.stderr
