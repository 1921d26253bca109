"""Warm trainers forked from the node's zygote (real processes: tests/agent/zygote_probe.py drives a supervisor
in a process of its own): they are the agent's children in process groups of their own, a trainer handed to
one trains, a warm trainer that dies is seen to, orphans are collected, and nothing outlives the supervisor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotmorph.local.cli_calls import ROOT
from tests.agent.test_prepare import STEPS
from worker_agent.agent.zygote import INHERITED_ENV, InheritedProcess


# make soak; make test: tests/e2e/test_vm_start.py's agent adopts its zygote and its job trains
@pytest.mark.soak
@pytest.mark.slow
def test_forked_warm_trainers_are_the_agents_children_and_train_and_nothing_outlives_it(tmp_path: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-m", "tests.agent.zygote_probe", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    seen = json.loads(probe.stdout.splitlines()[-1])
    warm = seen["warm"]
    assert len(set(warm)) == 2 and seen["zygote"] not in warm
    assert seen["parents"] == [seen["parents"][0]] * 2 and seen["parents"][0] != seen["zygote"], (
        "adopted by the supervisor's process, not left with the zygote"
    )
    assert seen["groups"] == warm, "each in a process group of its own"
    assert seen["cmdlines_are_the_zygotes"], "forks of the zygote, not new interpreters"
    assert seen["trainer"]["pid"] in warm and seen["trainer"]["exit"] == 0 and seen["trainer"]["step"] == STEPS, seen
    assert seen["killed_exit"] == -9
    assert len(set(seen["replaced"]) - {0}) == 2 and not set(seen["replaced"]) & set(warm), seen["replaced"]
    assert seen["orphans_reaped"] == 1
    assert seen["children_left"] == [] and seen["pending_children_left"] == []
    assert seen["zygote_after_kill_all"] not in (0, seen["zygote"]), "kill_all (registering anew) keeps no dead zygote"
    assert seen["pending_pids"] == [0, 0], "asked of a zygote still importing: no pid yet, and none signalled"
    pending = seen["pending_trainer"]
    assert pending["exit"] == 0 and pending["step"] == STEPS and pending["pid"] > 0, pending
    assert not seen["pid_file_at_start"] and seen["pending_pid_file"] == pending["pid"], "its pid file, once known"
    assert seen["pid_when_kill_returned"] == 0, "a kill does not wait for the zygote to fork the trainer"
    doomed = seen["doomed_trainer"]
    assert doomed["pid"] > 0 and doomed["exit"] == -9 and seen["doomed_children_left"] == [], seen
    for pid in warm + seen["replaced"] + [seen["zygote"]]:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1]


def test_a_zygote_that_cannot_run_leaves_the_node_without_warm_trainers_not_without_trainers(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom pathlib import Path\nfrom worker_agent.agent.supervisor import Supervisor\n"
        "s = Supervisor(Path(sys.argv[1]), python='/bin/false', warm=2, zygote=True)\n"
        "for _ in range(4):\n    s.prewarm()\n    [w.process.wait(30) for w in s.warm_trainers.waiting]\n"
        "print(s.warm, [w.process.poll() for w in s.warm_trainers.waiting])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0 []", out.stdout + out.stderr  # given up: trainers start cold
    assert "the zygote exited" in out.stderr and "no more warm trainers on this node" in out.stderr, out.stderr


def test_an_inherited_zygote_is_taken_only_when_it_is_a_child_with_pipes_and_the_setting_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    read_end, write_end = os.pipe()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], process_group=0)
    try:
        with open(os.devnull) as plain:
            for value in (
                "",
                "x,y,z",
                "1,2",
                f"1,{write_end},{read_end}",
                f"{stranger.pid},{plain.fileno()},{read_end}",
            ):
                environ = {INHERITED_ENV: value, "OTHER": "kept"}
                assert InheritedProcess.take(environ) is None, value
                assert environ == {"OTHER": "kept"}, "removed, whatever it said: nothing started inherits it"
        assert caplog.text.count("names no zygote of this process") == 5
        environ = {INHERITED_ENV: f"{stranger.pid},{write_end},{read_end}"}
        taken = InheritedProcess.take(environ)
        assert taken is not None and taken.pid == stranger.pid and environ == {}
        assert not os.get_inheritable(write_end) and not os.get_inheritable(read_end)
        assert taken.poll() is None
        taken.end()
        assert taken.returncode == -9 and stranger.poll() is not None
        assert InheritedProcess.take({}) is None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize(
    ("env", "log"), [(["PATH=/bin"], "zygote.log"), ({"A": 1}, "zygote.log"), ({1: "a"}, "zygote.log"), ({}, None)]
)
def test_the_zygotes_settle_request_with_a_bad_field_changes_nothing(
    env: object, log: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker_agent.runtime.process import zygote

    monkeypatch.chdir(tmp_path)
    before = dict(os.environ)
    with pytest.raises(TypeError):
        zygote._settle(env, log)
    assert dict(os.environ) == before and not (tmp_path / "zygote.log").exists()
