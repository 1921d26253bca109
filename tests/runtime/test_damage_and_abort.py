"""Damaged checkpoints are never loaded (the previous one is, and the user is told); a peer killed
with SIGKILL makes the survivors exit non-zero within 30 s and leaves no committed-but-broken checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.runtime.helpers import run, train, train_cmd, wait_for
from worker_agent.contract import ExitCode, GenerationDir, StepCompleted, read_progress
from worker_agent.runtime.storage import checkpoint as ck

# One worker runs the module: its training fixture then runs once, not once per xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("damage-pristine")]


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints at steps 1, 2, 3 of a 1x1 run."""
    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    train(root, 1, 1, 3, "--checkpoint-interval=1")
    assert [s for s, _ in ck.step_dirs(root)] == [3, 2, 1]
    return root


def _truncate(d: Path) -> None:
    victim = d / "block0.pt"
    victim.write_bytes(victim.read_bytes()[:100])


def _flip_byte(d: Path) -> None:
    victim = d / "head.pt"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))


def _drop_manifest(d: Path) -> None:
    (d / ck.MANIFEST).unlink()


def _garble_manifest(d: Path) -> None:
    (d / ck.MANIFEST).write_text('{"format": "spotmorph.checkpoint/v1", "step": ')


def _killed_mid_write(d: Path) -> None:
    """What a kill leaves: some layer files and a rank's part file, no manifest."""
    (d / ck.MANIFEST).unlink()
    (d / "embed.pt").unlink()
    (d / ".parts").mkdir()
    (d / ".parts" / "abc-rank-0.json").write_text("[]")


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated file": (_truncate, "bytes, manifest says"),
    "wrong checksum": (_flip_byte, "checksum (XXH3-128) does not match"),
    "missing manifest": (_drop_manifest, "no manifest.json"),
    "garbled manifest": (_garble_manifest, "unreadable manifest"),
    "killed during write": (_killed_mid_write, "no manifest.json"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_to_previous(pristine: Path, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(pristine, root)
    damage, reason = DAMAGE[kind]
    damage(ck.step_dir(root, 3))
    warnings: list[str] = []
    found = ck.newest_valid(root, warn=warnings.append)
    assert found is not None and found.step == 2
    assert len(warnings) == 1 and "step-00000003" in warnings[0] and reason in warnings[0], warnings


def test_verify_command_reports_fallback_and_rejects_a_damaged_checkpoint(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(pristine, root)
    _flip_byte(ck.step_dir(root, 3))
    cli = [sys.executable, "-m", "spotmorph.cli", "checkpoint", "verify"]
    ok = run([*cli, str(root)])
    assert ok.returncode == 0, ok.explain()
    assert "step 2" in ok.stdout and "step-00000003" in ok.stderr
    bad = run([*cli, str(ck.step_dir(root, 3))])
    assert bad.returncode == 2, bad.explain()
    assert "checksum (XXH3-128) does not match" in bad.stderr and "Traceback" not in bad.stderr


def test_train_resumes_from_previous_checkpoint_after_damage_and_says_so(pristine: Path, tmp_path: Path) -> None:
    damaged, intact = tmp_path / "damaged", tmp_path / "intact"
    shutil.copytree(pristine, damaged)
    shutil.copytree(pristine, intact)
    _truncate(ck.step_dir(damaged, 3))
    result = train(damaged, 1, 1, 4)
    assert "skipping damaged checkpoint step-00000003" in result.stderr, result.explain()
    assert "step-00000002 (step 2)" in result.stderr
    train(intact, 1, 1, 4)
    diff = ck.diff(ck.resolve(intact), ck.resolve(damaged))
    assert diff["step_a"] == diff["step_b"] == 4
    assert diff["max_abs"] == 0.0, diff


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = re.search(r"^State:\s+(\S)", status, re.M)
    return state is not None and state.group(1) not in ("Z", "X")


def test_sigkill_of_a_peer_makes_survivors_exit_nonzero_within_30s(tmp_path: Path) -> None:
    root, run_dir = tmp_path / "ckpt", tmp_path / "run"
    cmd = train_cmd(root, 2, 2, 100000, "--checkpoint-interval=1", "--background-checkpoint", f"--run-dir={run_dir}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids: dict[int, int] = {}

        def started() -> bool:
            for rank in range(4):
                for record in read_progress(GenerationDir(run_dir).progress_file(rank)):
                    if isinstance(record.event, StepCompleted) and record.event.step >= 3:
                        pids[rank] = record.pid
            return len(pids) == 4

        wait_for(started, 90, "all four ranks past step 3")
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        survivors = [pids[r] for r in (0, 2, 3)]
        wait_for(lambda: not any(_alive(p) for p in survivors), 30, "survivors to exit")
        elapsed = time.monotonic() - killed_at
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert elapsed < 30
    assert proc.returncode == ExitCode.ABORTED, f"{out}\n{err}"
    codes = json.loads(re.search(r"exit codes by rank: (\[.*\])", err).group(1))  # type: ignore[union-attr]
    assert codes[1] == -signal.SIGKILL and all(codes[r] == ExitCode.ABORTED for r in (0, 2, 3)), err
    assert "did not exit" not in err
    # Whatever the kill interrupted, every checkpoint that has a manifest verifies.
    committed = [p for _, p in ck.step_dirs(root) if (p / ck.MANIFEST).exists()]
    assert committed
    for path in committed:
        ck.verify(path)
