"""The warm trainers of one node: kept waiting, handed to trainer starts, replaced, told to build a job ahead.

A warm trainer is ``python -m worker_agent.runtime.process.warm`` in a warm spool: torch imported, waiting for an
assignment. On a CPU node they are forked by the node's zygote (:mod:`worker_agent.agent.zygote`), which
imports once for all of them; elsewhere (a GPU node, or no zygote to be had) each is a new interpreter. A
trainer start that finds none waiting on a node with a zygote is a fresh fork of it too, not a cold interpreter.
Warm trainers are an optimisation: when they cannot start or keep dying unused, the node stops keeping them
and says why, and trainers start cold.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from morphing.jobspec import JobSpec
from worker_agent.agent.holders import Process, Warm, kill_group
from worker_agent.agent.zygote import InheritedProcess, Zygote
from worker_agent.contract import TrainersDir, WarmArguments, WarmSpool
from worker_agent.contract.code_identity import code_identity

LOG = logging.getLogger("spotmorph.agent")
MAX_WARM_DEATHS = 3  # warm trainers dying unused before the node stops keeping them


class WarmTrainers:
    def __init__(
        self,
        trainers_dir: TrainersDir,
        python: str,
        env: dict[str, str] | None,
        count: int,
        zygote: bool,
        inherited: InheritedProcess | None = None,
    ) -> None:
        """``inherited``: a zygote this process started before it was the agent, the first one to use."""
        self.trainers_dir = trainers_dir
        self.python = python
        self.env = env
        self.count = count  # how many to keep waiting (0: none, trainers start cold)
        self.waiting: list[Warm] = []
        self._serial = 0
        self._deaths = 0  # warm trainers that exited before being handed an assignment
        self._hint: tuple[str, str] | None = None  # the job last handed to them to build ahead, its spec
        self._use_zygote = zygote
        self._zygote: Zygote | None = None
        self._inherited = inherited
        if inherited is not None and not (zygote and count):
            self._inherited = None
            inherited.end()  # this node keeps no warm trainers, or starts each as a new interpreter

    def take(self, job_id: str, job: JobSpec) -> Warm | None:
        """A live warm trainer for ``job``, which leaves the waiting ones; None when there is none.

        Only one that has run no user code, or only ``job``'s (it built the model ahead: first), may become its
        trainer. When every one has run another job's code, one of them is ended and a fresh one started in its
        place (forked from the zygote, which imports no user code), so the assignment waits on no foreign build.
        When none waits at all, a node that has a zygote forks a fresh one for it (:meth:`_forked_for`).
        """
        identity = code_identity(job, job_id)
        self.waiting = [w for w in self.waiting if w.process.poll() is None]
        fit = [w for w in self.waiting if w.ran in (None, identity)]
        fit.sort(key=lambda w: (w.ran != identity, not w.spool.ready()))
        if fit:
            self.waiting.remove(fit[0])
            return fit[0]
        if not self.waiting:
            return self._forked_for(job_id)
        foreign = self.waiting.pop(0)
        LOG.info("warm trainer %s ran another job's code: ended, a fresh one takes %s", foreign.spool.path.name, job_id)
        kill_group(foreign.process)
        return self._fresh()

    def _forked_for(self, job_id: str) -> Warm | None:
        """None waits: on a node that forks its warm trainers, a fresh fork of the zygote (no user code ran in it)
        takes the start, its imports done once for the node, not again in a new interpreter; None elsewhere (no
        zygote, or the node gave up its warm trainers), and the trainer starts cold."""
        if not self.count or self._zygote_at_hand() is None:
            return None
        LOG.info("no warm trainer waits: one forked from the zygote takes %s", job_id)
        return self._fresh()

    def _fresh(self) -> Warm | None:
        self._serial += 1
        spool = self.trainers_dir.warm_spool(f"w-{os.getpid()}-{self._serial}")
        shutil.rmtree(spool.path, ignore_errors=True)
        spool.path.mkdir(parents=True)
        process = self._start(spool)
        return Warm(process, spool) if process is not None else None

    def replenish(self) -> None:
        """Start warm trainers until ``count`` of them wait (call when no morph is under way)."""
        alive = [w for w in self.waiting if w.process.poll() is None]
        self._deaths += len(self.waiting) - len(alive)
        self.waiting = alive
        if self._deaths >= MAX_WARM_DEATHS:
            self._stop(f"{self._deaths} warm trainers exited before they were used")
        while len(self.waiting) < self.count:
            warm = self._fresh()
            if warm is None:
                return
            self.waiting.append(warm)

    def _start(self, spool: WarmSpool) -> Process | None:
        zygote = self._zygote_at_hand()
        if zygote is not None:
            return zygote.fork(spool)
        command = WarmArguments(spool.path, os.getpid()).command(self.python)
        try:
            with open(spool.log_file, "ab") as log:
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, process_group=0, env=self.env)
        except OSError as exc:
            self._stop(f"cannot start {command[0]}: {exc.strerror or exc}")
            return None
        spool.pid_file.write_text(str(process.pid))
        return process

    def _zygote_at_hand(self) -> Zygote | None:
        """The node's zygote, started on first use; None where there is none (then or ever after)."""
        if self._zygote is not None and not self._zygote.alive():
            why = self._zygote.spool.log_file
            LOG.warning("the zygote exited (see %s); warm trainers start as new interpreters", why)
            self._zygote, self._use_zygote = None, False
        if self._zygote is None and self._use_zygote:
            spool = self.trainers_dir.warm_spool(f"z-{os.getpid()}")
            inherited, self._inherited = self._inherited, None
            if inherited is not None:
                self._zygote = Zygote.adopt(inherited, spool, self.env)
            else:
                self._zygote = Zygote.start(self.python, spool, self.env)
            self._use_zygote = self._zygote is not None
        return self._zygote

    def prepare(self, job_id: str, job: JobSpec) -> None:
        """Hand ``job`` to the waiting warm trainers to build its model ahead: the controller's hint that a
        growth may bring it to this free node. Each builds it once; nothing runs until an assignment."""
        text, identity = job.model_dump_json(), code_identity(job, job_id)
        self._hint = (job_id, text)
        for warm in list(self.waiting):
            if warm.process.poll() is not None:
                continue
            if warm.ran not in (None, identity):  # it ran another job's code: no use to this one, nor to others
                LOG.info("warm trainer %s ran another job's code: ended for %s's build", warm.spool.path.name, job_id)
                kill_group(warm.process)
                self.waiting.remove(warm)
                continue
            warm.ran = identity  # from the hand-over on it may run the job's code
            if warm.spool.hand_prepare(text):
                LOG.info("warm trainer %s: building %s's model ahead", warm.spool.path.name, job.name)

    def building(self) -> str:
        """The job whose model a waiting warm trainer is still building ahead ("": none)."""
        if self._hint is None:
            return ""
        job_id, text = self._hint
        return job_id if any(w.process.poll() is None and w.spool.building(text) for w in self.waiting) else ""

    def ready(self) -> int:
        """Warm trainers that have finished their imports."""
        return sum(1 for w in self.waiting if w.process.poll() is None and w.spool.ready())

    def pids(self) -> set[int]:
        """The processes this keeps (waiting warm trainers, the zygote): waited for by their own handles."""
        zygote = {self._zygote.process.pid} if self._zygote is not None else set()
        return {w.process.pid for w in self.waiting} | zygote

    def kill_all(self) -> None:
        """End every warm trainer and the zygote; the next :meth:`replenish` starts a new zygote (an agent that
        registers anew kills all and goes on)."""
        if self._zygote is not None:
            self._zygote.stop()  # first: a warm trainer it has not answered for yet is answered for at once
            self._zygote = None
        for warm in self.waiting:
            kill_group(warm.process)
        self.waiting = []

    def _stop(self, why: str) -> None:
        if self.count:
            LOG.warning("no more warm trainers on this node (%s); trainers start cold", why)
        self.count = 0
