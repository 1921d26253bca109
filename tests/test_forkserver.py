"""The suite's fork server (tests/forkserver.py) runs a ``python -m`` or ``-c`` command as a new interpreter would: its
argv, working directory, environment, default signal handlers, stdout, stderr and exit code; past its timeout
the command is killed and the server goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from spotmorph.local import cli_calls
from tests import forkserver_client


def test_a_forked_command_runs_as_a_new_interpreter_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKSERVER_MARKER", "seen")
    code, out, err = forkserver_client.run(["-m", "tests.forkserver_echo", "3", "0"], tmp_path, 60)
    said = json.loads(out)
    assert code == 3 and err == "to stderr\n"
    assert said == {
        "argv": ["3", "0"],
        "cwd": str(tmp_path),
        "marker": "seen",
        "sigint_default": True,
        "sigterm_default": True,
        "name": "__main__",
    }
    monkeypatch.delenv("FORKSERVER_MARKER")
    code, out, _ = forkserver_client.run(["-m", "tests.forkserver_echo", "0"], tmp_path, 60)
    assert code == 0 and json.loads(out)["marker"] is None, "each command gets the environment of its call"


def test_python_c_runs_its_code_as_main_with_its_arguments_as_a_new_interpreter_would(tmp_path: Path) -> None:
    code = (
        "import json, os, sys; print(json.dumps([__name__, sys.argv, sys.path[0], os.getcwd()])); "
        "sys.exit(int(sys.argv[1]))"
    )
    forked = forkserver_client.run(["-c", code, "4", "x"], tmp_path, 60)
    new = subprocess.run([sys.executable, "-c", code, "4", "x"], cwd=tmp_path, capture_output=True, text=True)
    assert forked == (new.returncode, new.stdout, new.stderr) == (4, json.dumps(
        ["__main__", ["-c", "4", "x"], "", str(tmp_path)]) + "\n", "")  # fmt: skip
    failed = forkserver_client.run(["-c", "raise ValueError('no')"], tmp_path, 60)
    assert failed[0] == 1 and failed[2].rstrip().endswith("ValueError: no") and 'File "<string>"' in failed[2]


def test_a_command_past_its_timeout_is_killed_and_the_next_one_runs(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver_client.run(["-m", "tests.forkserver_echo", "0", "60"], tmp_path, 1)
    code, _, err = forkserver_client.run(["-m", "spotmorph.cli", "train"], tmp_path, 60)
    assert code == 2 and err.splitlines()[-1].startswith("spotmorph train: error: the following arguments are"), err
    assert "Warning" not in err, "what a new interpreter says, and nothing more"


@pytest.mark.slow
def test_the_harness_commands_go_through_the_runner_with_their_environment(tmp_path: Path) -> None:
    seen: list[tuple[list[str], dict[str, str], float]] = []

    def forked(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
        seen.append((list(argv), dict(env), timeout))
        return forkserver_client.run(argv, cli_calls.ROOT, timeout, env)

    missing = str(tmp_path / "nothing-here")
    before = cli_calls.use_runner(forked)
    try:
        inside = cli_calls.run_cli(("checkpoint", "verify", missing), {"MARK": "1", "PATH": "/usr/bin:/bin"}, 90, False)
        with pytest.raises(cli_calls.CommandFailed, match="exited 2"):
            cli_calls.run_cli(("checkpoint", "verify", missing), {"PATH": "/usr/bin:/bin"})
        cli_calls.use_runner(None)
        new = cli_calls.run_cli(("checkpoint", "verify", missing), {"PATH": "/usr/bin:/bin"}, 90, False)
    finally:
        cli_calls.use_runner(before)
    assert seen[0] == (
        ["-m", "spotmorph.cli", "checkpoint", "verify", missing],
        {"MARK": "1", "PATH": "/usr/bin:/bin"},
        90,
    )
    assert (inside.returncode, inside.stdout, inside.stderr) == (new.returncode, new.stdout, new.stderr)
    assert inside.returncode == 2 and missing in inside.stderr, inside
