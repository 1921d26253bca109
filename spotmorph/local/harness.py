"""Driving a local cluster from outside, as a user would: for the demo, the benchmarks and the e2e tests.

A :class:`LocalCluster` runs ``spotmorph`` commands in a home of its own (``SPOTMORPH_HOME``; the
caller's ``SPOTMORPH_CONTROLLER``/``SPOTMORPH_TOKEN`` are dropped, so a cluster someone else runs is
never touched), polls ``status --json`` until a predicate holds, evicts and adds nodes, reads the
trainers' progress through :mod:`worker_agent.contract`, and says what happened when something failed
(the controller's event log, the jobs it submitted with their seeds, the tail of every log).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from controller.client.context import Context
from controller.eventlog.fact import Fact
from controller.eventlog.schema import Logged, logged
from spotmorph.local.cli_calls import ROOT, ask, run_cli
from spotmorph.local.clouds import read_cloud
from spotmorph.local.cluster import require_context, start_controller
from spotmorph.local.layout import ClusterDir, VmDir
from spotmorph.local.platform import announce_eviction
from spotmorph.local.processes import alive, read_pid, spawn, wait_for
from spotmorph.local.provider import LocalVm, kill_vm

# Re-exported: the demo, the benchmarks and the tests take the reference runs from the harness.
from spotmorph.local.reference import checkpoint_diff as checkpoint_diff
from spotmorph.local.reference import max_rel_diff as max_rel_diff
from spotmorph.local.reference import train_reference as train_reference
from worker_agent.contract import (
    CheckpointLoaded,
    CheckpointWritten,
    ProgressRecord,
    StepCompleted,
    TrainingFinished,
    TrainingStopped,
    read_progress,
)

TINY_GPT_SPEC = ROOT / "examples" / "tiny_gpt.yaml"
ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
# The progress events that say how many steps were done.
HAS_STEP = (CheckpointLoaded, StepCompleted, CheckpointWritten, TrainingStopped, TrainingFinished)
E = TypeVar("E")
F = TypeVar("F", bound=Fact)


class JobEnded(RuntimeError):
    """The job ended (succeeded, failed, cancelled) before what was waited for happened."""


def cluster_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment pointed at ``home``, without a controller or token of someone else's."""
    env = {**os.environ, "SPOTMORPH_HOME": str(home), **(extra or {})}
    for name in ("SPOTMORPH_CONTROLLER", "SPOTMORPH_TOKEN"):
        env.pop(name, None)
    return env


def first_event(records: Iterable[ProgressRecord], kind: type[E]) -> tuple[float, E] | None:
    """When the first event of ``kind`` was written, and the event."""
    return next(((r.time, r.event) for r in records if isinstance(r.event, kind)), None)


def last_step(records: Iterable[ProgressRecord]) -> int:
    """The most steps any of ``records`` says were done (0 if none says)."""
    return max((r.event.step for r in records if isinstance(r.event, HAS_STEP)), default=0)


def world_size(status: Mapping[str, Any]) -> int:
    layout = status["layout"]
    return int(layout["pipeline_stages"]) * int(layout["data_parallel"])


class LocalCluster:
    """A local cluster in ``home/local``, driven through the ``spotmorph`` command."""

    def __init__(self, home: Path, env: Mapping[str, str] | None = None, poll: float = 0.3) -> None:
        self.home = home
        self.files = ClusterDir.of_home(home)
        self.env = cluster_env(home, env)
        self.poll = poll  # seconds between two looks at whatever is waited for
        self.submitted: dict[str, dict[str, object]] = {}  # job -> the --set values it was submitted with
        self.notes: list[str] = []  # what a test wants in its failure report (a chaos seed, the faults applied)

    # -- commands ---------------------------------------------------------------------------------

    def cli(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_cli(args, self.env, timeout, check)

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def ask(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A read-only client command (status, nodes, events, jobs) in this process, as it runs as a process:
        what the harness polls (spotmorph.local.cli_calls says why)."""
        context = self.context()
        return ask(args, ",".join(context.addresses()), context.token(), check)

    def ask_json(self, *args: str) -> Any:
        return json.loads(self.ask(*args, "--json").stdout)

    def up(
        self,
        nodes: int,
        slots: int = 2,
        heartbeat_expiry: float = 5.0,
        *,
        netns: bool = False,
        gpus_per_node: int = 0,
        tensorboard_dir: Path | None = None,
        warm_trainers: int | None = None,
        controllers: int = 1,
        database: str | None = None,
        cloud: str = "azure",
        on_demand_nodes: int = 0,
        deadline_timing: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """``warm_trainers``: per node, for this VM's agents and those added later (a cluster that runs no job
        saves each node's zygote with 0); the agent's default when None."""
        if warm_trainers is not None:
            self.env["SPOTMORPH_WARM_TRAINERS"] = str(warm_trainers)
        args = ["--nodes", str(nodes), "--slots", str(slots), "--heartbeat-expiry", str(heartbeat_expiry)]
        args += ["--gpus-per-node", str(gpus_per_node)] if gpus_per_node else []
        args += ["--tensorboard-dir", str(tensorboard_dir)] if tensorboard_dir is not None else []
        args += ["--controllers", str(controllers)] if controllers != 1 else []
        args += ["--database", database] if database else []
        args += ["--cloud", cloud] if cloud != "azure" else []
        args += ["--on-demand-nodes", str(on_demand_nodes), *deadline_timing] if on_demand_nodes else []
        return self.cli("local", "up", *args, *(["--netns"] if netns else []))

    def add(self, count: int = 1) -> None:
        self.cli("local", "add", str(count))

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.cli("local", "down", check=False)

    def submit(self, spec: Path = TINY_GPT_SPEC, **sets: object) -> str:
        """``spotmorph submit SPEC --set k=v ... --skip-model-check``: the repository's specs name their own
        profiles, and the check (which builds the model here, 2 s for the demo's) has tests of its own
        (tests/e2e/test_user_error.py, tests/cli); :meth:`submit_checked` submits as a user does."""
        return self._submit(spec, sets, ["--skip-model-check"])

    def submit_checked(self, spec: Path = TINY_GPT_SPEC, **sets: object) -> str:
        """``spotmorph submit SPEC --set k=v ...``, the profile checked against the model's layers."""
        return self._submit(spec, sets, [])

    def _submit(self, spec: Path, sets: dict[str, object], extra: list[str]) -> str:
        args = ["submit", str(spec), *extra]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        job = str(self.cli_json(*args)["id"])
        self.submitted[job] = dict(sets)
        return job

    def context(self) -> Context:
        return require_context(self.home)

    # -- what the controller says -----------------------------------------------------------------

    def status(self, job: str) -> dict[str, Any]:
        return dict(self.ask_json("status", job))

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.ask_json("nodes"))

    def node_state(self, node: str) -> str:
        return str({n["name"]: n["state"] for n in self.nodes()}.get(node, ""))

    def job_nodes(self, job: str) -> list[str]:
        """The nodes running ``job``, in join order (node-2 before node-10)."""
        names = [n["name"] for n in self.nodes() if n["job"] == job]
        return sorted(names, key=lambda n: (len(n), n))

    def events(self, job: str | None = None) -> list[dict[str, Any]]:
        """The controller's event log (of ``job``), one dict an event."""
        out = self.ask("events", "--json", *(["--job", job] if job else []))
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    def facts(self, kind: type[F], job: str | None = None) -> list[Logged[F]]:
        """The controller's events of ``kind`` (of ``job``), decoded into the facts it wrote."""
        return logged(self.events(job), kind)

    def event_log(self) -> str:
        """The event log as ``spotmorph events`` shows it, or why it could not be read."""
        out = self.ask("events", check=False)
        return out.stdout + out.stderr

    # -- waiting ----------------------------------------------------------------------------------

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        wait_for(condition, timeout, what, poll=self.poll)

    def wait_status(
        self,
        job: str,
        until: Callable[[dict[str, Any]], bool],
        timeout: float,
        what: str = "",
        seen: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll ``status JOB`` until ``until(status)`` holds, and return that status.

        ``seen`` is shown every status polled. A job that ended with ``until`` false raises
        :class:`JobEnded` at once (an ended job does not change any more)."""
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.clear()
            found.update(self.status(job))
            if seen is not None:
                seen(found)
            if until(found):
                return True
            if found["state"] in ENDED:
                raise JobEnded(f"job {job} {found['state']} ({found.get('reason', '')}) before {what}; {found}")
            return False

        self.wait(reached, timeout, f"{what or 'a status'} of job {job}")
        return found

    def wait_state(self, job: str, states: set[str], timeout: float) -> dict[str, Any]:
        return self.wait_status(job, lambda s: s["state"] in states, timeout, f"state {sorted(states)}")

    def wait_step(self, job: str, step: int, timeout: float) -> dict[str, Any]:
        """Until the job did ``step`` steps (or succeeded)."""
        return self.wait_status(
            job, lambda s: int(s["step"]) >= step or s["state"] == "SUCCEEDED", timeout, f"step {step}"
        )

    def wait_released(self, job: str, timeout: float = 60) -> None:
        """Until no node runs ``job`` and its trainers have exited: a job's state (CANCELLED, FAILED) comes first,
        and a checkpoint in flight may still be committed until its trainers are gone."""
        self.wait(lambda: not any(n["job"] == job for n in self.nodes()), timeout, "the job's nodes to be free")
        trainers = [int(p.read_text()) for vm in self.vms() for p in vm.work_dir.trainers.pid_files()]
        self.wait(lambda: not any(alive(pid) for pid in trainers), timeout, "the trainers to exit")

    def wait_new_generation(self, job: str, after: int, timeout: float) -> tuple[int, int]:
        """Until the job runs a generation newer than ``after`` and every rank of it completed a step.

        Follows a generation that supersedes that one before its first step (a late growth); returns
        the generation and its world size."""
        status = self.wait_status(
            job, lambda s: s["state"] == "RUNNING" and int(s["generation"]) > after, timeout, f"generation > {after}"
        )
        current = {"generation": int(status["generation"]), "world": world_size(status)}

        def first_step() -> bool:
            if self.first_step_done(job, current["generation"], current["world"]):
                return True
            now = self.status(job)
            if now["state"] == "RUNNING" and int(now["generation"]) > current["generation"]:
                current.update(generation=int(now["generation"]), world=world_size(now))
            return False

        self.wait(first_step, timeout, f"the first step of generation {current['generation']}+ of {job}")
        return current["generation"], current["world"]

    # -- VMs and the controller process ----------------------------------------------------------

    def vms(self) -> list[LocalVm]:
        return [LocalVm(vm.path) for vm in self.files.vm_dirs()]

    def vm_of(self, node: str) -> LocalVm:
        for vm in self.vms():
            if vm.node_name == node:
                return vm
        raise RuntimeError(f"no VM runs {node}")

    def preempt(self, node: str, notice: float) -> float:
        """Announce an eviction as ``spotmorph local preempt`` does (the cluster's cloud's way); returns when it was
        published."""
        at = time.time()
        announce_eviction(read_cloud(self.files), self.context().imds_url, self.vm_of(node).name, node, notice)
        return at

    def kill(self, node: str) -> float:
        """Kill the node's VM as ``spotmorph local kill`` does; returns when."""
        at = time.time()
        kill_vm(self.vm_of(node))
        return at

    def start_agent(self, vm: VmDir, args: Sequence[str] | None = None) -> int:
        """Start an agent in ``vm`` (again), with its recorded command line or ``args``."""
        vm.path.mkdir(parents=True, exist_ok=True)
        pid = spawn(vm.command() if args is None else args, vm.log, self.env)
        vm.pid_file.write_text(str(pid))
        return pid

    def controller_pid(self) -> int | None:
        return read_pid(self.files.controller_pid)

    def kill_controller(self) -> None:
        pid = self.controller_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)

    def kill_leader(self) -> str:
        """``spotmorph local kill-leader``: the address of the controller it SIGKILLed."""
        return self.cli("local", "kill-leader").stdout.splitlines()[0].strip()

    def start_controller(self) -> None:
        """Start the controller again (after ``kill_controller``); returns once it serves."""
        start_controller(self.files, self.env)
        self.wait(lambda: self.ask("jobs", check=False).returncode == 0, 60, "the controller to serve again")

    # -- what the trainers say --------------------------------------------------------------------

    def progress(self, job: str, generation: int) -> dict[tuple[str, int], list[ProgressRecord]]:
        """The progress records of one generation, by (VM, rank)."""
        out = {}
        for vm in self.files.vm_dirs():
            directory = vm.work_dir.trainers.generation_dir(job, generation)
            for rank, path in directory.progress_files().items():
                out[(vm.name, rank)] = read_progress(path)
        return out

    def rank_progress(self, job: str, rank: int = 0) -> dict[int, list[ProgressRecord]]:
        """One rank's progress in every generation of ``job``, whichever VM ran it."""
        found: dict[int, list[ProgressRecord]] = {}
        for vm in self.files.vm_dirs():
            for directory in vm.work_dir.trainers.generation_dirs(job):
                if directory.progress_file(rank).exists():
                    found[directory.generation] = read_progress(directory.progress_file(rank))
        return found

    def steps_reported(self) -> int:
        """The most steps any trainer of any job reported (without asking the controller)."""
        return max(
            (
                last_step(read_progress(path))
                for vm in self.files.vm_dirs()
                for directory in vm.work_dir.trainers.generation_dirs()
                for path in directory.progress_files().values()
            ),
            default=0,
        )

    def first_step_done(self, job: str, generation: int, world: int) -> bool:
        """Every one of the ``world`` ranks of this generation completed a step."""
        files = self.progress(job, generation)
        return len(files) >= world and all(first_event(records, StepCompleted) for records in files.values())

    # -- when something failed --------------------------------------------------------------------

    def logs(self, tail: int = 1500) -> str:
        parts = []
        for path in self.files.logs():
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.relative_to(self.files.root)} (tail) ---\n{text[-tail:]}")
        return "\n".join(parts)

    def failure_report(self) -> str:
        """The controller's event log, the jobs submitted (with their seeds) and the tail of every log."""
        jobs = "\n".join(
            f"{job}: seed={sets.get('seed', '(the spec default)')} "
            + " ".join(f"{k}={v}" for k, v in sets.items() if k != "seed")
            for job, sets in self.submitted.items()
        )
        notes = "\n".join(self.notes)
        return (
            f"===== test notes =====\n{notes or '(none)'}\n"
            f"===== controller event log =====\n{self.event_log()}\n"
            f"===== jobs submitted =====\n{jobs or '(none)'}\n"
            f"===== logs =====\n{self.logs()}"
        )
