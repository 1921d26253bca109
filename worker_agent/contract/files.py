"""Where the agent and its trainers meet on disk: one class per folder, one method per file.

An agent's work dir holds ``agent.pid``, ``node-name`` and ``trainers/``; under that, each generation
of a job has ``<job>/gen-<g>/`` with the trainer's inputs (``job.json``, ``layout.json``), its
``control/`` folder (``stop``: stop at the next step boundary; ``checkpoint-request``: a counter, a new
value asks for a checkpoint at the next step boundary; ``lease``: renewed by the agent on every heartbeat
the controller answers, a trainer whose lease lapsed stops by itself; ``salvage.json``: after a failed
collective, which ranks write the just-in-time checkpoint; ``abort-collectives``: the controller holds the
generation, abort the communicators now; ``acknowledged``: the newest checkpoint step the controller
committed), and per rank ``progress-rank-<r>.jsonl`` (what it reports), ``rank-<r>.log`` (its stdout and
stderr) and ``rank-<r>.pid`` (so a restarted agent can kill what its previous incarnation left behind).
Warm trainers wait in ``trainers/.warm/<name>/``; ``trainers/wake`` is the FIFO trainers poke to wake the
agent (:mod:`worker_agent.contract.wake`). ``spotmorph train`` lays out its run dir as one
generation dir.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from worker_agent.contract.exit_codes import ExitCode
from worker_agent.contract.hostile import HostileFile, load_json_bounded, read_bounded, read_counter

_GENERATION = re.compile(r"^gen-(\d+)$")
_RANK_FILE = re.compile(r"^(?:progress-)?rank-(\d+)\.(?:jsonl|pid)$")
_LOG_FILE = re.compile(r"^rank-(\d+)\.log$")
MAX_CONTROL_BYTES = 64 << 10  # a salvage order names one rank per stage; a lease is two numbers


LEAVING = "leaving"


@dataclass(frozen=True)
class Lease:
    """The agent's word that the controller still knows this node: renewed at ``renewed`` (``time.monotonic()``,
    one clock for every process of a host) for ``valid_for`` seconds."""

    renewed: float
    valid_for: float

    def lapsed_for(self, now: float) -> float:
        """How long ago it ran out (<= 0: it still holds)."""
        return now - (self.renewed + self.valid_for)


@dataclass(frozen=True)
class ControlDir:
    """Requests from the agent (or ``spotmorph train``) to running trainers; the trainers only read it."""

    path: Path

    @property
    def stop_file(self) -> Path:
        return self.path / "stop"

    @property
    def checkpoint_request_file(self) -> Path:
        return self.path / "checkpoint-request"

    def _touch(self, file: Path) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        file.touch()

    def _publish(self, file: Path, text: str) -> None:
        """Write ``file`` whole (a temporary file renamed over it): a reader never sees half of it."""
        self.path.mkdir(parents=True, exist_ok=True)
        temporary = self.path / f".{file.name}.tmp-{os.getpid()}"
        temporary.write_text(text)
        temporary.replace(file)

    def request_stop(self, leaving: bool = False) -> None:
        """Stop at the next common step boundary; ``leaving``: this node is going (an eviction notice), so its
        trainers cannot keep their state for the next generation and the stop writes a checkpoint."""
        self._publish(self.stop_file, LEAVING if leaving else "")

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def leaving(self) -> bool:
        try:
            return read_bounded(self.stop_file, len(LEAVING)) == LEAVING.encode()
        except (OSError, HostileFile):
            return False

    def clear_stop(self) -> None:
        self.stop_file.unlink(missing_ok=True)

    def request_checkpoint(self, counter: int) -> None:
        """Publish the request counter (written whole)."""
        self._publish(self.checkpoint_request_file, str(counter))

    @property
    def salvage_file(self) -> Path:
        return self.path / "salvage.json"

    def request_salvage(self, order_json: str) -> None:
        """Publish the controller's salvage order (written whole)."""
        self._publish(self.salvage_file, order_json)

    def salvage_request(self) -> str | None:
        """The salvage order's text, if one was published (None too when the file is no bounded regular file)."""
        with contextlib.suppress(OSError, HostileFile):
            return read_bounded(self.salvage_file, MAX_CONTROL_BYTES).decode(errors="replace")
        return None

    def checkpoint_request(self) -> int:
        """The newest request counter; 0 when none was ever published, or when the file holds no counter."""
        with contextlib.suppress(OSError, HostileFile):
            return read_counter(self.checkpoint_request_file)
        return 0

    @property
    def abort_file(self) -> Path:
        return self.path / "abort-collectives"

    def request_abort(self) -> None:
        """Ask the generation's trainers to abort their collectives now (the controller holds the generation)."""
        self._touch(self.abort_file)

    def abort_requested(self) -> bool:
        return self.abort_file.exists()

    def clear_abort(self) -> None:
        self.abort_file.unlink(missing_ok=True)

    @property
    def acknowledged_file(self) -> Path:
        return self.path / "acknowledged"

    def acknowledge_checkpoint(self, step: int) -> None:
        """The newest checkpoint step the controller has acknowledged for this generation (written whole)."""
        self._publish(self.acknowledged_file, str(step))

    def acknowledged_checkpoint(self) -> int:
        """What :meth:`acknowledge_checkpoint` last wrote; 0 when nothing (or no counter) was acknowledged."""
        with contextlib.suppress(OSError, HostileFile):
            return read_counter(self.acknowledged_file)
        return 0

    @property
    def lease_file(self) -> Path:
        return self.path / "lease"

    def renew_lease(self, valid_for: float, now: float | None = None) -> None:
        """Renew the trainers' lease for ``valid_for`` seconds from ``now`` (``time.monotonic()``), written whole."""
        self.path.mkdir(parents=True, exist_ok=True)
        renewed = time.monotonic() if now is None else now
        temporary = self.path / f".lease.tmp-{os.getpid()}"
        temporary.write_text(json.dumps({"renewed": renewed, "valid_for": valid_for}))
        temporary.replace(self.lease_file)

    def lease(self) -> Lease | None:
        """The lease as last renewed; None when there is none (a run no agent supervises, e.g. ``spotmorph train``).

        An unreadable lease counts as one that ran out long ago: only the agent writes it, and always whole,
        so a lease that is no regular file, or holds anything but two finite numbers, was not written by it."""
        try:
            data = load_json_bounded(self.lease_file, MAX_CONTROL_BYTES)
            renewed, valid_for = float(data["renewed"]), float(data["valid_for"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return Lease(float("-inf"), 0.0)
        return Lease(renewed, valid_for)


@dataclass(frozen=True)
class GenerationDir:
    """One generation of one job on one node (or one ``spotmorph train`` run)."""

    path: Path

    @property
    def job_file(self) -> Path:
        return self.path / "job.json"

    @property
    def layout_file(self) -> Path:
        return self.path / "layout.json"

    @property
    def control(self) -> ControlDir:
        return ControlDir(self.path / "control")

    @property
    def job(self) -> str:
        return self.path.parent.name

    @property
    def generation(self) -> int:
        found = _GENERATION.match(self.path.name)
        if found is None:
            raise ValueError(f"{self.path} is not a generation dir (gen-<g>)")
        return int(found.group(1))

    @property
    def rendezvous_key_file(self) -> Path:
        """The generation's rendezvous key (hex, mode 0600): what its ranks prove to each other's store."""
        return self.path / "rendezvous.key"

    def write_rendezvous_key(self, key_hex: str) -> None:
        """Write the key readable by this user only (created so, never widened: no window for others)."""
        self.path.mkdir(parents=True, exist_ok=True)
        temporary = self.path / "rendezvous.key.tmp"
        temporary.unlink(missing_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key_hex)
        temporary.rename(self.rendezvous_key_file)

    def progress_file(self, rank: int) -> Path:
        return self.path / f"progress-rank-{rank}.jsonl"

    def log_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.log"

    def pid_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.pid"

    def progress_files(self) -> dict[int, Path]:
        """Every rank's progress file here, by rank."""
        return _by_rank(self.path.glob("progress-rank-*.jsonl"))

    def pid_files(self) -> dict[int, Path]:
        return _by_rank(self.path.glob("rank-*.pid"))

    def log_files(self) -> dict[int, Path]:
        """Every rank's log file here (what its trainer wrote to stdout and stderr), by rank."""
        return _by_rank(self.path.glob("rank-*.log"), _LOG_FILE)


@dataclass(frozen=True)
class WarmSpool:
    """A warm trainer's folder: it writes ``ready`` once imported, then waits for ``assignment.json``."""

    path: Path

    @property
    def ready_file(self) -> Path:
        return self.path / "ready"

    @property
    def assignment_file(self) -> Path:
        return self.path / "assignment.json"

    @property
    def pid_file(self) -> Path:
        return self.path / "warm.pid"

    @property
    def log_file(self) -> Path:
        return self.path / "warm.log"

    @property
    def held_file(self) -> Path:
        """Written by a trainer that stopped and keeps its state here for the next generation."""
        return self.path / "held.json"

    def ready(self) -> bool:
        return self.ready_file.exists()

    def holding(self) -> bool:
        return self.held_file.exists()

    def held_exit_code(self) -> int:
        """How the holder's last generation ended (``code`` in the held file): 0 for a stop that kept its step; a
        failure for a generation that ended before it took the step it was handed, which it holds again. A file
        that cannot be read says an abort (the process holds, but nothing says its generation succeeded)."""
        try:
            facts = load_json_bounded(self.held_file, 4096)
        except (OSError, HostileFile):
            return ExitCode.ABORTED
        code = facts.get("code", ExitCode.SUCCEEDED) if isinstance(facts, dict) else None
        if isinstance(code, int) and not isinstance(code, bool) and 0 <= code < 256:
            return code
        return ExitCode.ABORTED

    def hand_over(self, assignment_json: str) -> None:
        """Write the assignment whole (temp file, rename): the warm trainer polls for it."""
        temporary = self.path / f"{self.assignment_file.name}.tmp"
        temporary.write_text(assignment_json)
        temporary.rename(self.assignment_file)

    def assigned(self) -> bool:
        return self.assignment_file.exists()

    @property
    def prepare_file(self) -> Path:
        """The spec of a job the agent was told a growth may bring here: the warm trainer builds its model ahead."""
        return self.path / "prepare.json"

    def hand_prepare(self, job_json: str) -> bool:
        """Write (whole) the job the warm trainer should build ahead; False when it holds that one already."""
        if self.prepare_file.exists() and self.prepare_file.read_text() == job_json:
            return False
        temporary = self.path / f"{self.prepare_file.name}.tmp"
        temporary.write_text(job_json)
        temporary.rename(self.prepare_file)
        return True

    @property
    def prepared_file(self) -> Path:
        """Written by the warm trainer once it has tried to build a handed job (built or failed): its digest."""
        return self.path / "prepared"

    def mark_prepared(self, job_json: str) -> None:
        temporary = self.path / f"{self.prepared_file.name}.tmp"
        temporary.write_text(_digest(job_json))
        temporary.rename(self.prepared_file)

    def building(self, job_json: str) -> bool:
        """It was handed ``job_json`` to build ahead and has not finished trying."""
        try:
            handed = self.prepare_file.read_text() == job_json
        except OSError:
            return False
        try:
            return handed and self.prepared_file.read_text() != _digest(job_json)
        except OSError:
            return handed


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class TrainersDir:
    """The agent's ``trainers/`` folder: every generation it ran, and its warm trainers."""

    path: Path

    def generation_dir(self, job: str, generation: int) -> GenerationDir:
        return GenerationDir(self.path / job / f"gen-{generation}")

    def generation_dirs(self, job: str | None = None) -> list[GenerationDir]:
        """The generation dirs present (of ``job``, or of every job), oldest generation first."""
        found = [GenerationDir(p) for p in self.path.glob(f"{job or '*'}/gen-*") if _GENERATION.match(p.name)]
        return sorted(found, key=lambda d: (d.job, d.generation))

    def pid_files(self) -> list[Path]:
        """Every trainer pid file, of every job and generation."""
        return [p for d in self.generation_dirs() for p in d.pid_files().values()]

    @property
    def warm_root(self) -> Path:
        return self.path / ".warm"

    @property
    def wake_file(self) -> Path:
        """The agent's FIFO its trainers poke when it should look at once (:mod:`worker_agent.contract.wake`)."""
        return self.path / "wake"

    def warm_spool(self, name: str) -> WarmSpool:
        return WarmSpool(self.warm_root / name)

    def warm_spools(self) -> list[WarmSpool]:
        if not self.warm_root.is_dir():
            return []
        return [WarmSpool(p) for p in sorted(self.warm_root.iterdir()) if p.is_dir()]


@dataclass(frozen=True)
class AgentWorkDir:
    """The agent's ``--work-dir``: its own pid and node name, and its trainers."""

    path: Path

    @property
    def pid_file(self) -> Path:
        return self.path / "agent.pid"

    @property
    def node_name_file(self) -> Path:
        return self.path / "node-name"

    @property
    def trainers(self) -> TrainersDir:
        return TrainersDir(self.path / "trainers")


def _by_rank(paths: Iterable[Path], pattern: re.Pattern[str] = _RANK_FILE) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for path in paths:
        found = pattern.match(path.name)
        if found is not None:
            out[int(found.group(1))] = path
    return dict(sorted(out.items()))
