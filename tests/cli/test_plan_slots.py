"""``spotmorph plan`` says when the profile's ``compute_slots_per_node`` slows the plan (a CPU profile's cores
applied to a node of 8 GPUs made every stage 4x slower, silently), and ``--compute-slots-per-node`` overrides it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotmorph.cli import main

ROOT = Path(__file__).resolve().parents[2]
CPU_PROFILE = str(ROOT / "examples" / "profiles" / "tiny_gpt.json")  # calibrated on 2 cores: slots 2
GPU_PROFILE = str(ROOT / "examples" / "profiles" / "gpt48.json")  # no slots: a device per rank
EIGHT = ("--gpus", "8", "--gpus-per-node", "8", "--global-batch", "16")


def plan(capsys: pytest.CaptureFixture[str], profile: str, *args: str) -> tuple[int, str, str]:
    code = main(["plan", "--profile", profile, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_slots_applied_are_said_with_the_way_out(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, CPU_PROFILE, *EIGHT)
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("compute slots"))
    assert "the profile's compute_slots_per_node=2 was applied" in line
    assert "(8 on a node: each 4x slower)" in line and "--compute-slots-per-node none" in line
    assert out.splitlines()[-1].startswith("network"), out  # the last line stays the network's
    code, table, _ = plan(capsys, CPU_PROFILE, "--gpus", "1-4", "--gpus-per-node", "4", "--global-batch", "16")
    assert code == 0 and "compute_slots_per_node=2 was applied" in table and "each 2x slower" in table


def test_json_stays_json_and_the_line_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = plan(capsys, CPU_PROFILE, *EIGHT, "--json")
    assert code == 0 and json.loads(out)["feasible"]
    assert "compute_slots_per_node=2 was applied" in err


def test_nothing_is_said_where_the_slots_change_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, err = plan(capsys, CPU_PROFILE, "--gpus", "2", "--gpus-per-node", "2", "--global-batch", "16")
    assert "compute slots" not in out + err  # 2 ranks a node on 2 slots: full speed
    _, out, err = plan(capsys, CPU_PROFILE, "--gpus", "2", "--gpus-per-node", "8", "--global-batch", "16")
    assert "compute slots" not in out + err  # nodes of 8, but 2 GPUs in all
    _, out, err = plan(capsys, GPU_PROFILE, "--gpus", "16", "--gpus-per-node", "8", "--global-batch", "64")
    assert "compute slots" not in out + err


def test_the_override_reaches_the_planner(capsys: pytest.CaptureFixture[str]) -> None:
    applied = json.loads(plan(capsys, CPU_PROFILE, *EIGHT, "--json")[1])
    code, out, err = plan(capsys, CPU_PROFILE, *EIGHT, "--json", "--compute-slots-per-node", "none")
    assert code == 0 and "compute slots" not in err
    unslowed = json.loads(out)
    assert unslowed["samples_per_second"] > applied["samples_per_second"]
    assert unslowed["gpus_used"] > applied["gpus_used"]  # 8 ranks a node no longer time-share 2 cores
    eight = json.loads(plan(capsys, CPU_PROFILE, *EIGHT, "--json", "--compute-slots-per-node", "8")[1])
    assert eight["samples_per_second"] == pytest.approx(unslowed["samples_per_second"])


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_a_bad_override_exits_2_naming_it(capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, out, err = plan(capsys, CPU_PROFILE, *EIGHT, "--compute-slots-per-node", value)
    assert code == 2 and out == ""
    assert f"--compute-slots-per-node {value!r}: give a count >= 1, or none" in err
    assert len(err.strip().splitlines()) == 1
