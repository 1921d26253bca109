"""``spotmorph plan`` as users run it: a real subprocess, JSON output, and every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.helpers import Result, run

ROOT = Path(__file__).resolve().parents[2]
GPT48 = ROOT / "examples" / "profiles" / "gpt48.json"


def spotmorph(*args: str) -> Result:
    return run([sys.executable, "-m", "spotmorph.cli", *args])


def plan(*args: str) -> Result:
    return spotmorph("plan", *args)


@pytest.mark.slow
def test_single_plan_json_has_the_contract_fields() -> None:
    out = plan("--profile", str(GPT48), "--gpus", "37", "--gpus-per-node", "8", "--global-batch", "500", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["gpus"] == 37
    assert data["gpus_used"] == data["pipeline_stages"] * data["data_parallel"] <= 37
    assert sum(data["samples_per_replica"]) == 500
    assert len(data["samples_per_replica"]) == len(data["micro_batches_per_replica"]) == data["data_parallel"]
    assert [i for a, b in data["stage_layers"] for i in range(a, b)] == list(range(50))
    assert data["samples_per_second"] == pytest.approx(500 / data["predicted_step_seconds"])


def test_activation_recomputation_reaches_the_planner() -> None:
    """With memory to spare (this profile's parameters dominate), recomputation only adds a forward to every
    backward, so the best plan gets slower; the flag would change nothing if the planner never saw it."""
    common = ("--profile", str(GPT48), "--gpus", "8", "--global-batch", "64", "--json")
    plain = json.loads(plan(*common).stdout)
    recomputed = json.loads(plan(*common, "--activation-recomputation").stdout)
    assert plain["feasible"] and recomputed["feasible"]
    assert recomputed["samples_per_second"] < plain["samples_per_second"]


def test_range_gives_a_list_with_infeasible_entries_named() -> None:
    out = plan("--profile", str(GPT48), "--gpus", "5-9", "--gpus-per-node", "4", "--global-batch", "64", "--json")
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    assert [r["gpus"] for r in rows] == [5, 6, 7, 8, 9]
    assert rows[0] == {"gpus": 5, "feasible": False, "reason": rows[0]["reason"]}
    assert "memory" in rows[0]["reason"]
    assert all(r["feasible"] for r in rows[2:])


def test_human_table_and_single_view() -> None:
    table = plan("--profile", str(GPT48), "--gpus", "6-8", "--gpus-per-node", "8", "--global-batch", "64")
    assert table.returncode == 0
    assert "samples/s" in table.stdout.splitlines()[0]
    single = plan("--profile", str(GPT48), "--gpus", "16", "--gpus-per-node", "8", "--global-batch", "64")
    assert "throughput" in single.stdout and "stages x" in single.stdout
    for out in (table.stdout, single.stdout):  # a copied profile's network is said, with where it comes from
        last = out.splitlines()[-1]
        assert last.startswith("network             3.12 GB/s between nodes, all-reduce 2.50 GB/s"), last
        assert "(the profile's: 'analytic, not measured" in last, last


def test_no_fit_exits_non_zero_with_the_limit_named() -> None:
    out = plan("--profile", str(GPT48), "--gpus", "2", "--global-batch", "64")
    assert out.returncode == 1
    assert "memory" in out.stderr and "--gpus >= 7" in out.stderr
    as_json = plan("--profile", str(GPT48), "--gpus", "2", "--global-batch", "64", "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["feasible"] is False


def _profile_with(tmp_path: Path, edit: Any) -> str:
    data = json.loads(GPT48.read_text())
    edit(data)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def _set(path: list[Any], value: Any) -> Any:
    def edit(data: Any) -> None:
        for key in path[:-1]:
            data = data[key]
        data[path[-1]] = value

    return edit


def _drop(path: list[Any]) -> Any:
    def edit(data: Any) -> None:
        for key in path[:-1]:
            data = data[key]
        del data[path[-1]]

    return edit


BAD_PROFILES = [
    ("missing field", _drop(["cluster", "gpu_memory_bytes"]), "cluster.gpu_memory_bytes: missing"),
    ("negative time", _set(["layers", 3, "forward_seconds", "1"], -0.5), "layers[3].forward_seconds.1"),
    ("zero time", _set(["layers", 0, "backward_seconds", "2"], 0), "layers[0].backward_seconds.2"),
    ("empty layers", _set(["layers"], []), "layers"),
    ("wrong format", _set(["format"], "other/v9"), "field format"),
    ("unknown field", _set(["layers", 1, "flops"], 3), "layers[1].flops: unknown field"),
    ("string time", _set(["layers", 2, "forward_seconds", "1"], "fast"), "layers[2].forward_seconds.1"),
    ("mismatched sizes", _drop(["layers", 4, "backward_seconds", "8"]), "same micro-batch sizes"),
]


@pytest.mark.parametrize(("name", "edit", "expected"), BAD_PROFILES, ids=[b[0] for b in BAD_PROFILES])
def test_bad_profiles_exit_2_naming_the_field(tmp_path: Path, name: str, edit: Any, expected: str) -> None:
    out = plan("--profile", _profile_with(tmp_path, edit), "--gpus", "8", "--global-batch", "64")
    assert out.returncode == 2, out.stdout
    assert expected in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_unreadable_profiles(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "spotmorph.profile/v1", "layers": [')
    cases = {
        str(tmp_path / "missing.json"): "not found",
        str(broken): "not valid JSON",
        str(tmp_path): "cannot be read",
    }
    for path, expected in cases.items():
        out = plan("--profile", path, "--gpus", "8", "--global-batch", "64")
        assert out.returncode == 2
        assert expected in out.stderr
        assert "Traceback" not in out.stderr


BAD_ARGS = [
    (["--gpus", "0"], "GPU count must be >= 1"),
    (["--gpus", "-4"], "GPU count must be >= 1"),
    (["--gpus", "eight"], "give a count like 8"),
    (["--gpus", "9-3"], "range must go up"),
    (["--gpus", "8", "--global-batch", "0"], "global batch 0"),
    (["--gpus", "8", "--global-batch", "-5"], "global batch -5"),
    (["--gpus", "8", "--schedule", "zigzag"], "invalid choice"),
    (["--gpus", "8", "--gpus-per-node", "0"], "--gpus-per-node 0"),
    (["--gpus", "8", "--gpu-memory-gib", "-1"], "--gpu-memory-gib -1"),
    (["--gpus", "8", "--global-batch", "1.5"], "invalid int value"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_arguments_exit_2(args: list[str], expected: str) -> None:
    if "--global-batch" not in args:
        args = [*args, "--global-batch", "64"]
    out = plan("--profile", str(GPT48), *args)
    assert out.returncode == 2
    assert expected in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_required_flag_exits_2() -> None:
    out = plan("--gpus", "8", "--global-batch", "64")
    assert out.returncode == 2
    assert "--profile" in out.stderr


def test_plan_does_not_import_torch_or_grpc() -> None:
    code = (
        "import sys\n"
        "from spotmorph.cli import main\n"
        f"main(['plan', '--profile', {str(GPT48)!r}, '--gpus', '8', '--global-batch', '8', '--json'])\n"
        "assert 'torch' not in sys.modules and 'grpc' not in sys.modules, sorted(sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
