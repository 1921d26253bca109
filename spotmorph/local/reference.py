"""Reference runs: the demo model trained as one uninterrupted process, and the comparison of checkpoints
with it (``spotmorph checkpoint diff``), for the demo, the benchmarks and the end-to-end tests.

A reference run is shared: the first process to want it trains it under a lock, the others (a test run's
workers) wait and reuse it.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path
from typing import Any

from spotmorph.local.cli_calls import ROOT, CommandFailed, run_cli

TINY_GPT = f"{ROOT}/examples/tiny_gpt.py:build"


def train_reference(
    parent: Path,
    steps: int,
    global_batch: int,
    seed: int,
    *,
    replicas: int = 1,
    checkpoint_interval: int | None = None,
    keep: int | None = None,
    exact_micro_batch: int | None = None,
) -> Path:
    """An uninterrupted 1 x ``replicas`` float64 run of the demo model; reused when it was done before, by this
    process or another sharing ``parent`` (a test run's workers: the first trains it, the others wait on its lock).
    ``exact_micro_batch``: a float32 run in exact mode with micro-batches of that size instead."""
    exact = f"-exact{exact_micro_batch}" if exact_micro_batch else ""
    out = parent / f"reference-1x{replicas}-{steps}-{global_batch}-{seed}{exact}"
    parent.mkdir(parents=True, exist_ok=True)
    with open(parent / f"{out.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, or the process ends
        if not (out / "done").exists():
            _train(out, steps, global_batch, seed, replicas, checkpoint_interval, keep, exact_micro_batch)
    return out


def _train(
    out: Path,
    steps: int,
    global_batch: int,
    seed: int,
    replicas: int,
    checkpoint_interval: int | None,
    keep: int | None,
    exact_micro_batch: int | None,
) -> None:
    shutil.rmtree(out, ignore_errors=True)  # a run killed half-way left a directory without "done"
    exact = bool(exact_micro_batch)
    args = ["train", TINY_GPT, "--stages=1", f"--replicas={replicas}", f"--global-batch={global_batch}"]
    args += [f"--steps={steps}", f"--seed={seed}", f"--checkpoint-dir={out}"]
    args += ["--dtype=float32", "--exact", f"--micro-batch-size={exact_micro_batch}"] if exact else ["--dtype=float64"]
    if checkpoint_interval is not None:
        args.append(f"--checkpoint-interval={checkpoint_interval}")
    if keep is not None:
        args.append(f"--keep={keep}")
    run_cli(args, timeout=1800)
    (out / "done").write_text("")


def checkpoint_diff(expected: Path, actual: Path) -> dict[str, Any]:
    """``spotmorph checkpoint diff --json --bitwise`` of two checkpoint directories (their newest checkpoints):
    the numbers and the verdict (exit 1 only says they differ, which the JSON says too)."""
    command = ["checkpoint", "diff", str(expected), str(actual), "--json", "--bitwise"]
    out = run_cli(command, check=False)
    if out.returncode not in (0, 1):
        raise CommandFailed(f"spotmorph {' '.join(command)} exited {out.returncode}\n{out.stdout}\n{out.stderr}")
    return dict(json.loads(out.stdout))


def max_rel_diff(expected: Path, actual: Path) -> float:
    """The max relative error over every tensor; the two must hold the same tensors at the same step."""
    diff = checkpoint_diff(expected, actual)
    if diff["missing"] or diff["step_a"] != diff["step_b"]:
        raise RuntimeError(f"the checkpoints cannot be compared: {diff}")
    return float(diff["max_rel"])
