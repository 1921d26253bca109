"""``spotmorph simulate --jobs``: the JSON per policy, and bad input named with its fix (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotmorph.cli import main

from .test_plan_cli import ROOT, spotmorph

TRACE = ROOT / "examples" / "traces" / "aws-p3-spot.csv"
PROFILE = ROOT / "examples" / "profiles" / "gpt48.json"
GOOD = {"name": "a", "profile": "gpt48.json", "global_batch": 128, "steps": 40, "max_gpus": 10, "deadline_hours": 3}


def _jobs(tmp_path: Path, *jobs: dict[str, object]) -> Path:
    (tmp_path / "gpt48.json").write_text(PROFILE.read_text())
    path = tmp_path / f"jobs{len(list(tmp_path.glob('jobs*.yaml')))}.yaml"
    path.write_text(json.dumps({"jobs": list(jobs)}))  # JSON is YAML
    return path


@pytest.mark.slow
def test_simulate_jobs_json_reports_every_policy(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path, GOOD, {**GOOD, "name": "b", "priority": 1, "submit_hour": 1})
    out = spotmorph("simulate", "--trace", str(TRACE), "--jobs", str(jobs), "--json")
    assert out.returncode == 0, out.stderr
    policies = json.loads(out.stdout)["policies"]
    assert set(policies) == {"spotmorph", "spot-only", "on-demand-only", "uniform-progress"}
    for row in policies.values():
        assert set(row["jobs"]) == {"a", "b"}
        assert row["cost"] == sum(job["cost"] for job in row["jobs"].values())
        for job in row["jobs"].values():
            assert {"finished_hour", "met_deadline", "cost"} <= set(job)
    assert policies["on-demand-only"]["cost"] > policies["spotmorph"]["cost"] > 0
    table = spotmorph("simulate", "--trace", str(TRACE), "--jobs", str(jobs), "--policies", "spotmorph")
    assert table.returncode == 0 and "deadlines met" in table.stdout and "uniform" not in table.stdout


def test_simulate_jobs_runs_layouts_and_charges_each_loss_its_layouts_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --layouts, each job runs the planner's layout (here the one of best liveput) and a VM lost pauses it
    for what the loss costs that layout: loss pauses appear that the curve's replay does not charge. In process
    (``spotmorph.cli.main``): the subprocess form of the command is tested above."""
    long = {**GOOD, "steps": 300, "deadline_hours": 8}
    jobs = _jobs(tmp_path, long, {**long, "name": "b", "priority": 1, "submit_hour": 0.5})
    stormy = tmp_path / "stormy.csv"  # 12 VMs; every 5 minutes one leaves, and comes back 2.5 minutes later
    events = [f"0,add,vm{i}" for i in range(12)]
    for k in range(1, 48):
        events += [f"{k * 300_000},remove,vm{k % 12}", f"{k * 300_000 + 150_000},add,vm{k % 12}"]
    stormy.write_text("\n".join(events) + "\n")
    paused = {}
    for layouts in ("curve", "liveput"):
        argv = ["simulate", "--trace", str(stormy), "--jobs", str(jobs), "--policies", "spotmorph", "--json"]
        assert main([*argv, "--layouts", layouts]) == 0
        row = json.loads(capsys.readouterr().out)["policies"]["spotmorph"]
        paused[layouts] = sum(job["loss_pause_hours"] for job in row["jobs"].values())
    assert paused["curve"] == 0.0 and paused["liveput"] > 0.0
    alone = ["simulate", "--trace", str(stormy), "--profile", str(PROFILE), "--global-batch", "64"]
    assert main([*alone, "--layouts", "liveput"]) == 2
    assert "--layouts liveput goes with --jobs" in capsys.readouterr().err


@pytest.mark.slow
def test_simulate_jobs_bad_input_names_the_problem_and_the_fix(tmp_path: Path) -> None:
    missing = {k: v for k, v in GOOD.items() if k != "steps"}
    cases = [
        (_jobs(tmp_path, missing), [], "steps"),
        (_jobs(tmp_path, {**GOOD, "steps": -5}), [], "steps"),
        (_jobs(tmp_path, {**GOOD, "deadline_hours": -1}), [], "deadline_hours"),
        (_jobs(tmp_path, {**GOOD, "profile": "nowhere.json"}), [], "relative to the jobs file"),
        (_jobs(tmp_path, GOOD), ["--policies", "cheapest"], "unknown policy cheapest"),
        (_jobs(tmp_path, GOOD), ["--profile", str(PROFILE)], "drop --profile"),
        (_jobs(tmp_path, GOOD), ["--global-batch", "64"], "drop --global-batch"),
        (tmp_path / "absent.yaml", [], "cannot be read"),
    ]
    for path, extra, expected in cases:
        out = spotmorph("simulate", "--trace", str(TRACE), "--jobs", str(path), *extra)
        assert out.returncode == 2, (expected, out.stdout)
        assert expected in out.stderr, (expected, out.stderr)
        assert "Traceback" not in out.stderr
    neither = spotmorph("simulate", "--trace", str(TRACE))
    assert neither.returncode == 2 and "--jobs JOBS.yaml" in neither.stderr
