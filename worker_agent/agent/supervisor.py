"""Trainer processes on this node: start, ask to stop or to checkpoint, kill, and observe them.

Each trainer is ``python -m worker_agent.runtime.process.trainer`` with its files in its generation's dir
(:class:`worker_agent.contract.GenerationDir`): inputs, control requests, progress, log and pid file.
The contract says where each one is; this module decides when to write them. A trainer runs in a
process group of its own (so it can be killed with whatever it started) but in the agent's session (so
a host that kills the agent's session kills the whole node, as the local cluster does).

With ``warm=N`` the supervisor also keeps up to N *warm* trainers in the warm spools
(``python -m worker_agent.runtime.process.warm``: torch imported, waiting for an assignment file), and a
trainer start hands its arguments to one of them instead of starting a fresh interpreter; with none
at hand it starts cold as before. Spent warm trainers are replaced only by :meth:`Supervisor.prewarm`,
which the agent calls once its trainers are past their first step, so the imports of the
replacements do not compete with a morph for the CPU.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from morphing.jobspec import JobSpec
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.agent.holders import Ending, Finished, Holders, Process, Warm, ending, kill_group
from worker_agent.agent.progress import TrainerProgress, TrainerReport, absorb
from worker_agent.agent.warming import WarmTrainers
from worker_agent.agent.zygote import Adopted, InheritedProcess, reap_orphans
from worker_agent.contract import (
    CommittedCheckpoint,
    ExitCode,
    GenerationDir,
    ProgressReader,
    TrainerArguments,
    TrainersDir,
    WarmAssignment,
    WarmSpool,
)

LOG = logging.getLogger("spotmorph.agent")


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a trainer of one generation needs, as the controller's assignment gives it."""

    job: JobSpec
    layout: dict[str, Any]
    rendezvous: str
    checkpoint_dir: Path
    resume: CommittedCheckpoint | None = None  # the checkpoint the controller committed (None: from scratch)
    store_rank: int = 0
    held: CommittedCheckpoint | None = None  # the step the previous generation keeps in memory, if any
    # The generation's key (hex, from the controller), written where its trainers read it. The default, a fresh
    # random one, serves a LaunchSpec made by hand (every rank started from the same one shares it).
    rendezvous_key: str = field(default_factory=lambda: secrets.token_hex(32))


class _FailedStart:
    """A trainer whose process could not even be created: it has already exited."""

    pid = 0

    def poll(self) -> int:
        return ExitCode.NOT_STARTED

    def wait(self, timeout: float | None = None) -> int:
        return ExitCode.NOT_STARTED


@dataclass
class _Trainer:
    key: TrainerKey
    process: Process
    reader: ProgressReader
    log_path: Path
    stop_requested: bool = False
    progress: TrainerProgress = field(default_factory=TrainerProgress)
    hold_spool: WarmSpool | None = None
    pid_recorded: bool = False
    handed_held: bool = False  # its process held a step of this job, which its generation is to load
    release_asked_at: float | None = None  # when it was asked to give up its generation and hold that step again


class Supervisor:
    def __init__(
        self,
        work_dir: Path,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        warm: int = 0,
        zygote: bool = False,
        inherited: InheritedProcess | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``zygote``: fork warm trainers from one process that imported once (a CPU node's agent; this process
        then adopts its descendants' orphans, see :mod:`worker_agent.agent.zygote`), the ``inherited`` one first."""
        self.clock = clock
        self.trainers_dir = TrainersDir(work_dir)
        self.python = python
        self.env = env
        self.warm_trainers = WarmTrainers(self.trainers_dir, python, env, warm, zygote, inherited)
        self._adopts = zygote
        self._trainers: dict[TrainerKey, _Trainer] = {}
        self._hold_serial = 0
        self._checkpoint_requests: dict[tuple[str, int], int] = {}
        self.lease_seconds: float | None = None  # set once the agent registered: trainers started after get a lease
        self._salvage_orders: dict[tuple[str, int], str] = {}
        self._holders = Holders()  # trainers that stopped and keep their state for the next generation
        self.hold = True  # offer trainers a hold spool (a planned morph through memory)

    @property
    def warm(self) -> int:
        """How many warm trainers this node keeps waiting (0 once it gave them up)."""
        return self.warm_trainers.count

    def generation_dir(self, job_id: str, generation: int) -> GenerationDir:
        return self.trainers_dir.generation_dir(job_id, generation)

    def start(self, key: TrainerKey, spec: LaunchSpec, device_index: int | None = None) -> None:
        """Start the trainer of ``key`` (on CUDA device ``device_index``, if any); never the same key twice."""
        if key in self._trainers:
            return
        directory = self.generation_dir(key.job_id, key.generation)
        directory.control.path.mkdir(parents=True, exist_ok=True)
        directory.job_file.write_text(spec.job.model_dump_json())
        directory.layout_file.write_text(json.dumps(spec.layout))
        directory.progress_file(key.rank).unlink(missing_ok=True)
        directory.write_rendezvous_key(spec.rendezvous_key)
        log_path = directory.log_file(key.rank)
        hold_spool = self._hold_spool(key) if self.hold else None
        arguments = TrainerArguments.in_generation_dir(
            directory,
            key.rank,
            rendezvous=spec.rendezvous,
            checkpoint_dir=spec.checkpoint_dir,
            host_store=key.rank == spec.store_rank,
            device_index=device_index,
            fence_job=key.job_id,
            resume=spec.resume,
            held=spec.held,
            hold_spool=hold_spool.path if hold_spool is not None else None,
        )
        if self.lease_seconds is not None:
            directory.control.renew_lease(self.lease_seconds)  # before the trainer can look for it
        taken = self._hand_to_warm(WarmAssignment(arguments, log_path), key.job_id, spec.job)
        process: Process | None = taken.process if taken is not None else None
        if process is None:
            with open(log_path, "ab") as log:
                try:
                    process = subprocess.Popen(
                        arguments.command(self.python),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        process_group=0,
                        env=self.env,
                    )
                except (OSError, ValueError) as exc:  # ValueError: an argument with a NUL byte in it
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                    log.write(f"cannot start a trainer with {self.python}: {reason}\n".encode())
                    process = _FailedStart()
        reader = ProgressReader(directory.progress_file(key.rank))
        handed = spec.held is not None and taken is not None and taken.holds is not None
        self._trainers[key] = trainer = _Trainer(
            key, process, reader, log_path, hold_spool=hold_spool, handed_held=handed
        )
        self._record_pid(trainer)

    def _record_pid(self, trainer: _Trainer) -> None:
        """The trainer's pid files (what a next incarnation of the agent kills), once its pid is known: at once,
        or for a warm trainer the zygote has yet to fork, at a later report."""
        if trainer.pid_recorded or trainer.process.pid <= 0:
            return
        pid = str(trainer.process.pid)
        self.generation_dir(trainer.key.job_id, trainer.key.generation).pid_file(trainer.key.rank).write_text(pid)
        if trainer.hold_spool is not None:
            trainer.hold_spool.pid_file.write_text(pid)
        trainer.pid_recorded = True

    def _hold_spool(self, key: TrainerKey) -> WarmSpool:
        self._hold_serial += 1
        spool = self.trainers_dir.warm_spool(f"h-{os.getpid()}-{self._hold_serial}")
        shutil.rmtree(spool.path, ignore_errors=True)
        spool.path.mkdir(parents=True)
        return spool

    def _hand_to_warm(self, assignment: WarmAssignment, job_id: str, job: JobSpec) -> Warm | None:
        """Give the trainer's arguments to a process holding this job's state, else to a warm one that has run no
        other job's code (:meth:`WarmTrainers.take`); the one it went to (None: none)."""
        self._reap_holders()
        taken = self._holders.take(job_id) or self.warm_trainers.take(job_id, job)
        if taken is not None:
            taken.spool.hand_over(assignment.to_json())
        return taken

    def _reap_holders(self) -> None:
        """A trainer that stopped and holds its state has ended its generation (exit 0 for it); its process
        joins the holders, where the next generation's start on this node takes it over."""
        for trainer in self._trainers.values():
            spool = trainer.hold_spool
            process = trainer.process
            if spool is None or not isinstance(process, (subprocess.Popen, Adopted)) or process.poll() is not None:
                continue
            if spool.holding():
                trainer.process = Finished(process.pid, spool.held_exit_code())
                trainer.hold_spool = None
                self._holders.add(Warm(process, spool, (trainer.key.job_id, trainer.key.generation)))
                LOG.info("%s stopped and keeps its state in memory for the next generation", trainer.key)

    def prewarm(self) -> None:
        """Start warm trainers until ``warm`` of them wait (call when no morph is under way, so their start does
        not compete with a morph for the CPU); collect the orphans this node adopted, if it does."""
        self.warm_trainers.replenish()
        if self._adopts:
            waited = {t.process.pid for t in self._trainers.values()} | self._holders.pids()
            reap_orphans(waited | self.warm_trainers.pids())

    def prepare(self, job_id: str, job: JobSpec) -> None:
        """Hand ``job`` to the waiting warm trainers to build its model ahead (the controller's growth hint)."""
        self.warm_trainers.prepare(job_id, job)

    def building(self) -> str:
        """The job whose model a waiting warm trainer is still building ahead ("": none): the controller holds a
        growth onto this node until the build is done, so the growth's pause does not hold it."""
        return self.warm_trainers.building()

    def warm_ready(self) -> int:
        """Warm trainers that have finished their imports."""
        return self.warm_trainers.ready()

    def settled(self) -> bool:
        """No trainer is between its start and its first step (a good moment to start warm ones)."""
        self._reap_holders()
        return all(t.process.poll() is not None or t.progress.stepped for t in self._trainers.values())

    def exited_since(self, reported: set[TrainerKey]) -> bool:
        """Has a trainer exited that is not in ``reported``? (Cheap: no progress file is read.)"""
        self._reap_holders()
        return any(k not in reported and t.process.poll() is not None for k, t in self._trainers.items())

    def request_stop(self, job_id: str, generation: int, leaving: bool = False) -> None:
        self.generation_dir(job_id, generation).control.request_stop(leaving)
        for trainer in self._trainers.values():
            if (trainer.key.job_id, trainer.key.generation) == (job_id, generation):
                trainer.stop_requested = True

    def abort_collectives(self, job_id: str, generation: int) -> bool:
        """Tell a held generation's trainers to abort their collectives; True the first time (idempotent)."""
        control = self.generation_dir(job_id, generation).control
        if control.abort_requested():
            return False
        control.request_abort()
        return True

    def request_checkpoint(self, job_id: str, generation: int, counter: int) -> None:
        """Pass the controller's checkpoint request counter to a generation's trainers (once per value)."""
        if self._checkpoint_requests.get((job_id, generation)) == counter:
            return
        self.generation_dir(job_id, generation).control.request_checkpoint(counter)
        self._checkpoint_requests[(job_id, generation)] = counter

    def renew_leases(self, job_id: str, generation: int) -> None:
        """Renew the lease of the generation's running trainers (the controller just answered a heartbeat)."""
        if self.lease_seconds is None:
            return
        if any(
            k.job_id == job_id and k.generation == generation and t.process.poll() is None
            for k, t in self._trainers.items()
        ):
            self.generation_dir(job_id, generation).control.renew_lease(self.lease_seconds)

    def acknowledge(self, job_id: str, generation: int, step: int) -> None:
        """The controller has this generation's checkpoint of ``step``: its writer may prune what is older."""
        if step > 0 and (job_id, generation) in {(k.job_id, k.generation) for k in self._trainers}:
            control = self.generation_dir(job_id, generation).control
            if step > control.acknowledged_checkpoint():
                control.acknowledge_checkpoint(step)

    def running(self) -> list[TrainerKey]:
        self._reap_holders()
        return [k for k, t in self._trainers.items() if t.process.poll() is None]

    def request_salvage(self, job_id: str, generation: int, order_json: str) -> None:
        """Publish the controller's salvage order to a generation's holding trainers (once per order)."""
        if self._salvage_orders.get((job_id, generation)) == order_json:
            return
        self.generation_dir(job_id, generation).control.request_salvage(order_json)
        self._salvage_orders[(job_id, generation)] = order_json

    def newly_held(self, reported: set[TrainerKey]) -> bool:
        """Has a running trainer not in ``reported`` said that its collective failed? (Reads progress files.)"""
        return any(r.held is not None and r.status.key not in reported for r in self.reports() if r.status.running)

    def kill(self, key: TrainerKey) -> None:
        trainer = self._trainers.get(key)
        if trainer is None or trainer.process.poll() is not None:
            return
        kill_group(trainer.process)

    def end(self, key: TrainerKey, may_hold: bool = False) -> bool:
        """End a trainer the controller no longer runs (call again until it has ended); True when it was killed.

        ``may_hold`` (the node goes on with the trainer's job): one handed a held step it has not loaded yet is first
        asked to give up its generation (its control dir's abort): it holds that step again, so the next generation
        still takes it from memory (``TrainerProcess.next_generation``). It is killed if it has not within
        :data:`RELEASE_SECONDS`."""
        trainer = self._trainers.get(key)
        if trainer is None or trainer.process.poll() is not None:
            return False
        holds = may_hold and trainer.handed_held and not (trainer.progress.loaded or trainer.progress.stepped)
        now = self.clock()
        match ending(holds, trainer.release_asked_at, now):
            case Ending.ASK:
                trainer.release_asked_at = now
                self.generation_dir(key.job_id, key.generation).control.request_abort()
                LOG.info("%s: asked to give up its generation and hold the step it was handed again", key)
                return False
            case Ending.WAIT:
                return False
            case Ending.KILL:
                kill_group(trainer.process)
                return True

    def kill_all(self) -> None:
        """Every process of this node: the zygote first, so a trainer it has not forked yet is answered for now
        (forked: killed and waited for; not: never started) and nothing is left to be forked later."""
        self.warm_trainers.kill_all()
        for key in list(self._trainers):
            self.kill(key)
        self._holders.drop(set())

    def reports(self) -> list[TrainerReport]:
        self._reap_holders()
        return [self._report(t) for t in self._trainers.values()]

    def forget(self, keep: set[tuple[str, int]]) -> None:
        """Drop exited trainers of generations other than ``keep`` (reported already)."""
        for key, trainer in list(self._trainers.items()):
            if trainer.process.poll() is not None and (key.job_id, key.generation) not in keep:
                del self._trainers[key]
        self._checkpoint_requests = {k: v for k, v in self._checkpoint_requests.items() if k in keep}
        self._salvage_orders = {k: v for k, v in self._salvage_orders.items() if k in keep}
        self._holders.drop(keep)

    def _report(self, trainer: _Trainer) -> TrainerReport:
        self._record_pid(trainer)
        code = trainer.process.poll()  # first: an exit is reported with every record written before it (its class)
        for record in trainer.reader.poll():
            trainer.progress = absorb(trainer.progress, record)
        progress = trainer.progress
        error = progress.error
        if code not in (None, ExitCode.SUCCEEDED) and not error:
            error = f"exit code {code}: {self.log_tail(trainer.key)}"
        status = TrainerStatus(trainer.key, code is None, code, trainer.stop_requested)
        return TrainerReport(
            status=status,
            pid=trainer.process.pid,
            step=progress.step,
            loss=progress.loss,
            samples_per_second=progress.samples_per_second,
            last_checkpoint_step=progress.last_checkpoint_step,
            error=error,
            failure=progress.failure,
            finished=progress.finished,
            eval_step=progress.eval_step,
            eval_loss=progress.eval_loss,
            first_step_at=progress.first_step_at,
            first_step_seconds=progress.first_step_seconds,
            last_step_at=progress.last_step_at,
            held=progress.held,
            stall_step=progress.stall_step,
            stall_seconds=progress.stall_seconds,
            held_skipped=progress.held_skipped,
            held_skipped_cause=progress.held_skipped_cause,
            hand_off_failed=progress.hand_off_failed,
        )

    def log_tail(self, key: TrainerKey, lines: int = 5) -> str:
        trainer = self._trainers.get(key)
        if trainer is None or not trainer.log_path.exists():
            return ""
        text = trainer.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:])
