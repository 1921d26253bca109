"""Trainer processes on this node: start, ask to stop, kill, and observe (exit codes and progress).

Each trainer is ``python -m worker_agent.runtime.trainer`` in its own process group, with its files
under ``work_dir/<job>/gen-<g>/``: ``job.json`` and ``layout.json`` (inputs), ``control/stop`` (the
graceful-stop request), ``progress-rank-<r>.jsonl`` (what it reports) and ``rank-<r>.log``
(its stdout and stderr, kept for the operator and quoted when it fails) and ``rank-<r>.pid`` (so a
restarted agent can kill what its previous incarnation left behind).

With ``warm=N`` the supervisor also keeps up to N *warm* trainers under ``work_dir/.warm/``
(``python -m worker_agent.runtime.warm``: torch imported, waiting for an assignment file), and a
trainer start hands its arguments to one of them instead of starting a fresh interpreter; with none
at hand it starts cold as before. Spent warm trainers are replaced only by :meth:`Supervisor.prewarm`,
which the agent calls once its trainers are past their first step, so the imports of the
replacements do not compete with a morph for the CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from morphing.jobspec import JobSpec
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.runtime.trainer import STOP_FILE
from worker_agent.runtime.warm import ASSIGNMENT, READY

WARM_DIR = ".warm"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a trainer of one generation needs, as the controller's assignment gives it."""

    job: JobSpec
    layout: dict[str, Any]
    rendezvous: str
    checkpoint_dir: Path
    load_from: str | None = None
    store_rank: int = 0


@dataclass(frozen=True)
class TrainerReport:
    """A trainer's observed state: status plus the latest facts from its progress file."""

    status: TrainerStatus
    pid: int
    step: int = 0
    loss: float | None = None
    samples_per_second: float | None = None
    last_checkpoint_step: int | None = None
    error: str = ""
    finished: bool = False


class _Process(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class _FailedStart:
    """A trainer whose process could not even be created: it has already exited, with 127."""

    pid = 0

    def poll(self) -> int:
        return 127

    def wait(self, timeout: float | None = None) -> int:
        return 127


@dataclass
class _Trainer:
    key: TrainerKey
    process: _Process
    progress_path: Path
    log_path: Path
    offset: int = 0
    stop_requested: bool = False
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Warm:
    process: subprocess.Popen[bytes]
    spool: Path

    @property
    def ready(self) -> bool:
        return (self.spool / READY).exists()


class Supervisor:
    def __init__(
        self, work_dir: Path, python: str = sys.executable, env: dict[str, str] | None = None, warm: int = 0
    ) -> None:
        self.work_dir = work_dir
        self.python = python
        self.env = env
        self.warm = warm
        self._trainers: dict[TrainerKey, _Trainer] = {}
        self._warm: list[_Warm] = []
        self._warm_serial = 0

    def generation_dir(self, job_id: str, generation: int) -> Path:
        return self.work_dir / job_id / f"gen-{generation}"

    def start(self, key: TrainerKey, spec: LaunchSpec) -> None:
        """Start the trainer of ``key``; a key that was started before is never started again."""
        if key in self._trainers:
            return
        gen_dir = self.generation_dir(key.job_id, key.generation)
        (gen_dir / "control").mkdir(parents=True, exist_ok=True)
        job_path, layout_path = gen_dir / "job.json", gen_dir / "layout.json"
        job_path.write_text(spec.job.model_dump_json())
        layout_path.write_text(json.dumps(spec.layout))
        progress = gen_dir / f"progress-rank-{key.rank}.jsonl"
        progress.unlink(missing_ok=True)
        log_path = gen_dir / f"rank-{key.rank}.log"
        arguments = [
            "--job",
            str(job_path),
            "--layout",
            str(layout_path),
            "--rank",
            str(key.rank),
            "--rendezvous",
            spec.rendezvous,
            "--generation",
            str(key.generation),
            "--checkpoint-dir",
            str(spec.checkpoint_dir),
            "--control-dir",
            str(gen_dir / "control"),
            "--progress",
            str(progress),
        ]
        if key.rank == spec.store_rank:
            arguments.append("--host-store")
        if spec.load_from:
            arguments += ["--load-from", spec.load_from]
        process: _Process | None = self._hand_to_warm(arguments, log_path)
        if process is None:
            with open(log_path, "ab") as log:
                try:
                    process = subprocess.Popen(
                        [self.python, "-m", "worker_agent.runtime.trainer", *arguments],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=self.env,
                    )
                except OSError as exc:
                    log.write(f"cannot start a trainer with {self.python}: {exc.strerror or exc}\n".encode())
                    process = _FailedStart()
        if process.pid > 0:
            (gen_dir / f"rank-{key.rank}.pid").write_text(str(process.pid))
        self._trainers[key] = _Trainer(key, process, progress, log_path)

    def _hand_to_warm(self, arguments: list[str], log_path: Path) -> subprocess.Popen[bytes] | None:
        """Give the trainer's arguments to a warm process (a ready one first); None when there is none."""
        self._warm = [w for w in self._warm if w.process.poll() is None]
        self._warm.sort(key=lambda w: not w.ready)
        if not self._warm:
            return None
        warm = self._warm.pop(0)
        temporary = warm.spool / f"{ASSIGNMENT}.tmp"
        temporary.write_text(json.dumps({"argv": arguments, "log": str(log_path)}))
        temporary.rename(warm.spool / ASSIGNMENT)
        return warm.process

    def prewarm(self) -> None:
        """Start warm trainers until ``warm`` of them wait (call when no morph is under way)."""
        self._warm = [w for w in self._warm if w.process.poll() is None]
        while len(self._warm) < self.warm:
            self._warm_serial += 1
            spool = self.work_dir / WARM_DIR / f"w-{os.getpid()}-{self._warm_serial}"
            shutil.rmtree(spool, ignore_errors=True)
            spool.mkdir(parents=True)
            command = [self.python, "-m", "worker_agent.runtime.warm", "--spool", str(spool), "--parent"]
            with open(spool / "warm.log", "ab") as log:
                process = subprocess.Popen(
                    [*command, str(os.getpid())],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=self.env,
                )
            (spool / "warm.pid").write_text(str(process.pid))
            self._warm.append(_Warm(process, spool))

    def warm_ready(self) -> int:
        """Warm trainers that have finished their imports."""
        return sum(1 for w in self._warm if w.process.poll() is None and w.ready)

    def settled(self) -> bool:
        """No trainer is between its start and its first step (a good moment to start warm ones)."""
        return all(t.process.poll() is not None or t.facts.get("stepped", False) for t in self._trainers.values())

    def exited_since(self, reported: set[TrainerKey]) -> bool:
        """Has a trainer exited that is not in ``reported``? (Cheap: no progress file is read.)"""
        return any(k not in reported and t.process.poll() is not None for k, t in self._trainers.items())

    def request_stop(self, job_id: str, generation: int) -> None:
        (self.generation_dir(job_id, generation) / "control").mkdir(parents=True, exist_ok=True)
        (self.generation_dir(job_id, generation) / "control" / STOP_FILE).touch()
        for trainer in self._trainers.values():
            if (trainer.key.job_id, trainer.key.generation) == (job_id, generation):
                trainer.stop_requested = True

    def kill(self, key: TrainerKey) -> None:
        trainer = self._trainers.get(key)
        if trainer is None or trainer.process.poll() is not None:
            return
        try:
            os.killpg(trainer.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        trainer.process.wait()

    def kill_all(self) -> None:
        for key in list(self._trainers):
            self.kill(key)
        for warm in self._warm:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(warm.process.pid, signal.SIGKILL)
            warm.process.wait()
        self._warm = []

    def reports(self) -> list[TrainerReport]:
        return [self._report(t) for t in self._trainers.values()]

    def forget(self, keep: set[tuple[str, int]]) -> None:
        """Drop exited trainers of generations other than ``keep`` (reported already)."""
        for key, trainer in list(self._trainers.items()):
            if trainer.process.poll() is not None and (key.job_id, key.generation) not in keep:
                del self._trainers[key]

    def _report(self, trainer: _Trainer) -> TrainerReport:
        self._read_progress(trainer)
        code = trainer.process.poll()
        facts = trainer.facts
        error = str(facts.get("error", ""))
        if code not in (None, 0) and not error:
            error = f"exit code {code}: {self.log_tail(trainer.key)}"
        status = TrainerStatus(trainer.key, code is None, code, trainer.stop_requested)
        return TrainerReport(
            status=status,
            pid=trainer.process.pid,
            step=int(facts.get("step", 0)),
            loss=facts.get("loss"),
            samples_per_second=facts.get("samples_per_second"),
            last_checkpoint_step=facts.get("last_checkpoint_step"),
            error=error,
            finished=bool(facts.get("finished", False)),
        )

    def log_tail(self, key: TrainerKey, lines: int = 5) -> str:
        trainer = self._trainers.get(key)
        if trainer is None or not trainer.log_path.exists():
            return ""
        text = trainer.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _read_progress(self, trainer: _Trainer) -> None:
        try:
            with open(trainer.progress_path, "rb") as handle:
                handle.seek(trainer.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        trainer.offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            _absorb(trainer.facts, record)


def _absorb(facts: dict[str, Any], record: dict[str, Any]) -> None:
    event = record.get("event")
    if "step" in record:
        facts["step"] = record["step"]
    for name in ("loss", "samples_per_second"):
        if record.get(name) is not None:
            facts[name] = record[name]
    checkpoint = record.get("last_checkpoint")
    if checkpoint is not None:
        facts["last_checkpoint_step"] = checkpoint
    if event == "step":
        facts["stepped"] = True
    if event == "finished":
        facts["finished"] = True
    if event == "error":
        facts["error"] = str(record.get("message", "error"))
