"""Run ``spotmorph train`` as real processes and read what they leave behind."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import forkserver_client as forkserver

REPO = Path(__file__).resolve().parents[2]
TINY = f"{REPO}/examples/tiny_gpt.py:build_tiny"
BAD_MODELS = f"{REPO}/tests/runtime/bad_models.py"


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str

    def explain(self) -> str:
        return f"exit {self.returncode}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def train_cmd(
    checkpoint_dir: Path, stages: int, replicas: int, steps: int, *extra: str, entrypoint: str = TINY
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "spotmorph.cli",
        "train",
        entrypoint,
        f"--stages={stages}",
        f"--replicas={replicas}",
        f"--steps={steps}",
        f"--checkpoint-dir={checkpoint_dir}",
        "--global-batch=7",
        "--micro-batch-size=2",
        "--log-every=1",
        "--device=cpu",  # the same numbers on a machine with GPUs; GPU tests append --device=cuda
        *extra,
    ]


def run(
    cmd: list[str], timeout: float = 120, env: Mapping[str, str] | None = None, new_interpreter: bool = False
) -> Result:
    """``cmd`` from the repository's root, with ``env`` (this process's environment by default); ``python -m
    spotmorph.cli ...`` and ``python -c ...`` forked from this worker's fork server (tests/forkserver.py says why
    and when not) unless a ``new_interpreter`` is asked for, anything else a new process.
    ``SPOTMORPH_TEST_FORKSERVER=0`` makes every command a new process."""
    forks = cmd[:3] == [sys.executable, "-m", "spotmorph.cli"] or (cmd[:2] == [sys.executable, "-c"] and len(cmd) > 2)
    if forks and not new_interpreter and forkserver.enabled():
        return Result(*forkserver.run(cmd[1:], REPO, timeout, env))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def probe(script: str, *args: str, timeout: float = 180, new_interpreter: bool = False) -> dict[str, Any]:
    """Run ``script`` (Python source) in a process of its own with ``args`` (forked from the fork server, or a
    ``new_interpreter`` where the process itself is measured); the JSON object its last line prints."""
    result = run([sys.executable, "-c", script, *args], timeout=timeout, new_interpreter=new_interpreter)
    assert result.returncode == 0, result.explain()
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


def train(checkpoint_dir: Path, stages: int, replicas: int, steps: int, *extra: str) -> Result:
    result = run(train_cmd(checkpoint_dir, stages, replicas, steps, "--dtype=float64", *extra))
    assert result.returncode == 0, result.explain()
    return result


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def as_sha256_format(step: Path, format: str) -> None:
    """Rewrite the manifest of ``step`` as a v1 or v2 writer left it: each file's SHA-256, not its XXH3-128."""
    path = step / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["files"]:
        del entry["xxh3_128"]
        entry["sha256"] = hashlib.sha256((step / entry["path"]).read_bytes()).hexdigest()
    manifest["format"] = format
    path.write_text(json.dumps(manifest))
