"""``spotmorph train`` on the CPU forks its ranks from the launcher (torch imported once): each rank is a
process of the launcher's, in a session of its own, and trains exactly what a new interpreter per rank
(``--spawn-ranks``) trains."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spotmorph.local.harness import max_rel_diff
from tests.runtime.helpers import REPO, train, train_cmd, wait_for
from worker_agent.contract import GenerationDir, read_progress
from worker_agent.runtime.process.forked import ForkedRank, read_port

pytestmark = pytest.mark.slow


def test_forked_ranks_are_the_launchers_in_sessions_of_their_own_and_train_what_spawned_ones_do(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    command = train_cmd(tmp_path / "forked", 1, 2, 6, "--dtype=float64", f"--run-dir={run_dir}")
    launcher = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        files = [GenerationDir(run_dir).progress_file(rank) for rank in range(2)]
        wait_for(lambda: all(read_progress(f) for f in files), 120, "both ranks' first progress")
        pids = [read_progress(f)[0].pid for f in files]
        for pid in pids:
            assert Path(f"/proc/{pid}/cmdline").read_bytes() == Path(f"/proc/{launcher.pid}/cmdline").read_bytes()
            assert os.getsid(pid) == pid  # its own session: a signal to the launcher's group does not reach it
        stdout, stderr = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, stderr
    assert "finished at step 6" in stdout, stdout
    spawned = train(tmp_path / "spawned", 1, 2, 6, "--spawn-ranks", f"--run-dir={tmp_path / 'run-spawned'}")
    assert "finished at step 6" in spawned.stdout, spawned.stdout
    assert max_rel_diff(tmp_path / "spawned", tmp_path / "forked") == 0.0


def test_a_forked_rank_whose_launcher_never_says_the_port_exits_saying_so() -> None:
    read, write = os.pipe()
    rank = ForkedRank(lambda: [str(read_port(read))], close=(write,))
    os.close(read)
    os.close(write)  # the launcher "ended" before the store was up
    assert rank.wait() == 1
    assert rank.poll() == 1


def test_the_port_is_read_up_to_its_line_while_other_ranks_hold_the_pipe_open() -> None:
    read, write = os.pipe()
    os.write(write, b"29500\n")
    assert read_port(read) == 29500  # the write end is still open: the line, not EOF, ends the read
    os.close(write)
