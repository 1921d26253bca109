"""Run a layout on this machine: P x D trainer processes around a TCPStore hosted here.

Each rank is a real OS process started with the same entry a worker agent uses
(``python -m worker_agent.runtime.trainer``). A SIGINT/SIGTERM to the launcher becomes the control
file that asks the trainers for a graceful stop. When one trainer fails the others are given time to
notice (their process-group timeouts) and are killed only if they overstay it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType

from morphing.jobspec import JobSpec
from morphing.layout import Layout
from worker_agent.runtime.trainer import STOP_FILE


@dataclass(frozen=True)
class LocalRun:
    job: JobSpec
    layout: Layout
    checkpoint_dir: Path
    run_dir: Path
    generation: int = 0
    log_every: int = 10
    load_from: Path | None = None


def progress_path(run_dir: Path, rank: int) -> Path:
    return run_dir / f"progress-rank-{rank}.jsonl"


def run_local(run: LocalRun) -> int:
    """Start every rank, relay rank 0's progress, return 0 / 2 (bad input) / 1 (failure)."""
    import torch.distributed as dist

    run.run_dir.mkdir(parents=True, exist_ok=True)
    control = run.run_dir / "control"
    control.mkdir(exist_ok=True)
    (control / STOP_FILE).unlink(missing_ok=True)
    job_path = run.run_dir / "job.json"
    layout_path = run.run_dir / "layout.json"
    job_path.write_text(run.job.model_dump_json(indent=1))
    layout_path.write_text(json.dumps(run.layout.to_dict(), indent=1))
    store = dist.TCPStore(  # type: ignore[attr-defined]  # exported at runtime, not in the stubs
        "127.0.0.1", 0, None, True, timedelta(seconds=120), wait_for_workers=False
    )
    procs = []
    for rank in range(run.layout.world_size):
        progress_path(run.run_dir, rank).unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "worker_agent.runtime.trainer",
            f"--job={job_path}",
            f"--layout={layout_path}",
            f"--rank={rank}",
            f"--rendezvous=127.0.0.1:{store.port}",
            f"--generation={run.generation}",
            f"--checkpoint-dir={run.checkpoint_dir}",
            f"--control-dir={control}",
            f"--progress={progress_path(run.run_dir, rank)}",
        ]
        if run.load_from is not None:
            cmd.append(f"--load-from={run.load_from}")
        procs.append(subprocess.Popen(cmd, start_new_session=True))

    def request_stop(signum: int, frame: FrameType | None) -> None:
        (control / STOP_FILE).touch()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _supervise(run, procs)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        del store


def _supervise(run: LocalRun, procs: list[subprocess.Popen[bytes]]) -> int:
    relay = _Relay(progress_path(run.run_dir, 0), run.log_every)
    grace = 2 * run.job.timeout_seconds + 10
    failed_at: float | None = None
    while any(p.poll() is None for p in procs):
        relay.poll()
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for rank, proc in enumerate(procs):
                if proc.poll() is None:
                    print(
                        f"spotmorph train: rank {rank} did not exit {grace:.0f}s after a failure; killing it",
                        file=sys.stderr,
                    )
                    proc.kill()
                    proc.wait()
        time.sleep(0.05)
    relay.poll()
    codes = [p.returncode for p in procs]
    if all(c == 0 for c in codes):
        return 0
    print(f"spotmorph train: trainer exit codes by rank: {codes}", file=sys.stderr)
    return 2 if 2 in codes else 1


class _Relay:
    """Prints rank 0's progress lines as they appear (every ``every`` steps, plus every event)."""

    def __init__(self, path: Path, every: int) -> None:
        self.path = path
        self.every = max(1, every)
        self.offset = 0

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        complete, _, _ = chunk.rpartition("\n")
        if not complete:
            return
        self.offset += len(complete) + 1
        for line in complete.split("\n"):
            self._show(json.loads(line))

    def _show(self, rec: dict[str, object]) -> None:
        event = rec["event"]
        if event == "step":
            step = int(str(rec["step"]))
            if step % self.every == 0:
                print(
                    f"step {step:6d}  loss {float(str(rec['loss'])):.4f}  "
                    f"{float(str(rec['samples_per_second'])):8.1f} samples/s",
                    flush=True,
                )
        elif event in ("checkpoint", "stopped", "finished"):
            print(f"{event} at step {rec['step']} (last checkpoint: step {rec['last_checkpoint']})", flush=True)
