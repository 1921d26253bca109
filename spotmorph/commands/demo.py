"""``spotmorph demo`` (what ``make demo`` runs): elastic training on a local cluster, checked exactly.

It starts a private local cluster (its own ``SPOTMORPH_HOME``, so a cluster you run is untouched),
submits the demo model in float64, evicts a node with notice through the Scheduled Events protocol,
adds a node, and ends with the morph timeline, the final loss and a comparison of the parameters
with an uninterrupted single-process run of the same job.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from morphing.errors import UserInputError
from worker_agent.contract import (
    AgentWorkDir,
    CheckpointLoaded,
    CheckpointWritten,
    ProgressRecord,
    StepCompleted,
    TrainingFinished,
    TrainingStopped,
    events_of,
    read_progress,
)

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "examples" / "tiny_gpt.yaml"
ENTRYPOINT = f"{ROOT}/examples/tiny_gpt.py:build"
TOLERANCE = 1e-9
# The progress events that say how many steps were done.
_HAS_STEP = (CheckpointLoaded, StepCompleted, CheckpointWritten, TrainingStopped, TrainingFinished)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps (default 500)")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--notice", type=float, default=15.0, help="eviction notice in seconds")
    parser.add_argument("--keep", action="store_true", help="keep the demo's files (logs, checkpoints)")


class _Demo:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "SPOTMORPH_HOME": str(home)}
        for name in ("SPOTMORPH_CONTROLLER", "SPOTMORPH_TOKEN"):
            self.env.pop(name, None)
        self.started = time.monotonic()

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "spotmorph.cli", *args], capture_output=True, text=True, env=self.env, cwd=ROOT
        )
        if out.returncode != 0:
            raise RuntimeError(f"spotmorph {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def status(self, job: str) -> dict[str, Any]:
        return dict(json.loads(self.cli("status", job, "--json")))

    def follow(self, job: str, until: Any, timeout: float = 240.0) -> dict[str, Any]:
        """Print progress until ``until(status)`` holds; fail loudly on a failed job or a timeout."""
        deadline = time.monotonic() + timeout
        shown = (-1, -1)
        while True:
            status = self.status(job)
            layout = status["layout"] or {}
            key = (int(status["step"]) // 25, int(status["generation"]))
            if key != shown:
                shape = f"{layout.get('pipeline_stages', '-')}x{layout.get('data_parallel', '-')}"
                bar = "#" * int(30 * int(status["step"]) / max(1, int(status["total_steps"])))
                self.say(
                    f"{status['state']:<9} gen {status['generation']} layout {shape:<5} "
                    f"step {status['step']:>4}/{status['total_steps']} [{bar:<30}]"
                )
                shown = key
            if status["state"] in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"job {job} {status['state']}: {status['reason']}")
            if until(status):
                return status
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for job {job}; last status {status}")
            time.sleep(0.5)

    def job_nodes(self, job: str) -> list[str]:
        return sorted(n["name"] for n in json.loads(self.cli("nodes", "--json")) if n["job"] == job)

    def progress_by_generation(self, job: str) -> dict[int, list[ProgressRecord]]:
        """Rank 0's progress of every generation of ``job``, whichever VM ran it."""
        found: dict[int, list[ProgressRecord]] = {}
        for vm in sorted((self.home / "local" / "vms").glob("*")):
            for directory in AgentWorkDir(vm).trainers.generation_dirs(job):
                if directory.progress_file(0).exists():
                    found[directory.generation] = read_progress(directory.progress_file(0))
        return found


def run(args: argparse.Namespace) -> int:
    if args.steps < 60 or args.global_batch < 1 or args.notice < 0:
        raise UserInputError("--steps must be >= 60, --global-batch >= 1 and --notice >= 0")
    home = Path(tempfile.mkdtemp(prefix="spotmorph-demo-"))
    demo = _Demo(home)
    try:
        return _run(demo, args)
    finally:
        try:
            demo.cli("local", "down")
        except RuntimeError as exc:
            print(f"warning: {exc}", file=sys.stderr)
        if args.keep:
            print(f"demo files kept in {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


def _run(demo: _Demo, args: argparse.Namespace) -> int:
    steps, batch = args.steps, args.global_batch
    checkpoints = demo.home / "checkpoints"
    demo.say("starting a local cluster: a controller, a Scheduled Events service, 2 nodes x 2 CPU slots")
    demo.cli("local", "up", "--nodes", "2", "--slots", "2", "--heartbeat-expiry", "5")
    sets = {
        "steps": steps,
        "global_batch": batch,
        "dtype": "float64",
        "seed": 0,
        "checkpoint_interval": 20,
        "checkpoint_dir": checkpoints,
    }
    submit = ["submit", str(SPEC), "--json"]
    for key, value in sets.items():
        submit += ["--set", f"{key}={value}"]
    job = json.loads(demo.cli(*submit))["id"]
    demo.say(f"submitted {job}: the tiny GPT of examples/tiny_gpt.py, B={batch}, {steps} steps, float64")

    demo.follow(job, lambda s: s["state"] == "RUNNING" and int(s["step"]) >= steps // 5)
    victim = demo.job_nodes(job)[-1]
    demo.say(f"evicting {victim} with {args.notice:.0f}s notice (Azure Scheduled Events, served locally)")
    demo.cli("local", "preempt", victim, "--notice", str(args.notice))
    demo.follow(job, lambda s: int(s["generation"]) >= 2 and int(s["step"]) >= steps * 2 // 5)

    demo.say("a new node arrives; the controller grows the job after the debounce if the planner says it pays")
    demo.cli("local", "add", "1")
    demo.follow(job, lambda s: int(s["generation"]) >= 3 or s["state"] == "SUCCEEDED")
    final = demo.follow(job, lambda s: s["state"] == "SUCCEEDED")

    _timeline(demo, job, final)
    demo.say("training the same job as one uninterrupted process (the reference) ...")
    reference = demo.home / "reference"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "spotmorph.cli",
            "train",
            ENTRYPOINT,
            "--stages=1",
            "--replicas=1",
            f"--global-batch={batch}",
            f"--steps={steps}",
            "--dtype=float64",
            "--seed=0",
            f"--checkpoint-dir={reference}",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    diff = json.loads(demo.cli("checkpoint", "diff", str(reference), str(checkpoints), "--json"))
    same = diff["max_rel"] <= TOLERANCE and not diff["missing"]
    verdict = "EQUAL" if same else "DIFFERENT"
    demo.say(
        f"parameters and optimizer state vs the uninterrupted run: {verdict} "
        f"(max relative error {diff['max_rel']:.2e} over {diff['tensors_compared']} tensors; bound {TOLERANCE:g})"
    )
    print(
        "\nNext: `spotmorph plan --profile examples/profiles/gpt48.json --gpus 1-64 --gpus-per-node 8 "
        "--global-batch 512` asks the planner what bigger clusters would give a 5.6 B-parameter model."
    )
    return 0 if same else 1


def _timeline(demo: _Demo, job: str, final: dict[str, Any]) -> None:
    progress = demo.progress_by_generation(job)
    events = [json.loads(line) for line in demo.cli("events", "--json").splitlines() if line.strip()]
    issued = [e for e in events if e["kind"] == "GenerationIssued" and e.get("job") == job]
    seconds = {m["generation"]: m["seconds"] for m in final["morphs"]}
    print("\nmorph timeline")
    print(f"  {'gen':>3}  {'layout':<18} {'resumed at':>10} {'steps lost':>10} {'morph s':>8}  cause")
    for event in issued:
        data = event["data"]
        generation = int(data["generation"])
        before = [r.event.step for r in progress.get(generation - 1, []) if isinstance(r.event, _HAS_STEP)]
        lost = max(0, max(before, default=0) - int(data["resume_step"])) if generation > 1 else 0
        morph = seconds.get(generation)
        print(
            f"  {generation:>3}  {data['layout']:<18} {data['resume_step']:>10} {lost:>10} "
            f"{'' if morph is None else f'{morph:.1f}':>8}  {data['cause']}"
        )
    last = progress.get(int(final["generation"]), [])
    losses = [e.loss for e in events_of(last, StepCompleted)]
    first_losses = [e.loss for e in events_of(progress.get(1, []), StepCompleted)]
    print(f"\n  steps lost in total: {final['steps_lost']}")
    if losses and first_losses:
        print(f"  loss: {first_losses[0]:.3f} at the first step -> {losses[-1]:.3f} at step {final['step']}")
