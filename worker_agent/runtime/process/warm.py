"""A warm trainer: a process that has imported torch and the runtime and waits for its assignment.

``python -m worker_agent.runtime.process.warm`` with :class:`worker_agent.contract.WarmArguments`. Once its
imports are done (torch, the runtime, and the model libraries it supports when installed) it writes its
spool's ready file; it then polls for the assignment file (a :class:`worker_agent.contract.WarmAssignment`,
written atomically by the agent's supervisor), points its stdout and stderr at the trainer's log and runs
:func:`worker_agent.runtime.process.trainer.main` with those arguments, exactly as a cold ``python -m
worker_agent.runtime.process.trainer`` would. A morph then pays no interpreter start and no ``import torch``. It
exits by itself when the agent that started it is gone (its parent pid changes), so a dead VM leaves nothing
behind.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker_agent.contract import WarmArguments, WarmAssignment, WarmSpool
from worker_agent.contract.code_identity import code_identity
from worker_agent.contract.hostile import read_bounded
from worker_agent.runtime.link.spool import MAX_ASSIGNMENT_BYTES, take_over, wait_for_assignment

if TYPE_CHECKING:
    from worker_agent.runtime.process.warm_model import ModelShelf

# Libraries the runtime takes models from (hf_adapter), imported ahead when installed: a Hugging Face model's
# entrypoint spends seconds in ``transformers.modeling_utils`` (2.2 s of 2.4 s for GPT-2's classes, measured
# here), which a growth onto a new VM would otherwise pay inside the morph's pause.
MODEL_LIBRARIES = ("transformers.modeling_utils",)
# The node's operator may name others, comma-separated, or none (an empty value): a node that never trains a
# Hugging Face model saves that import's 2 s of CPU and its memory in every warm trainer and zygote.
IMPORTS_ENV = "SPOTMORPH_WARM_IMPORTS"
PREPARE_SECONDS_ENV = "SPOTMORPH_PREPARE_SECONDS"  # how long a build ahead may take before it is abandoned
DEFAULT_PREPARE_SECONDS = 300.0
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def ahead_imports(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The modules to import ahead: :data:`MODEL_LIBRARIES` unless ``SPOTMORPH_WARM_IMPORTS`` is set; a name
    in it that is no module name is left out with a warning that says how to write one."""
    value = environ.get(IMPORTS_ENV)
    if value is None:
        return MODEL_LIBRARIES
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if not MODULE_NAME.fullmatch(n)]
    for name in bad:
        warn(f"{IMPORTS_ENV}: {name[:80]!r} is no module name (write dotted names, comma-separated), left out")
    return tuple(n for n in names if n not in bad)


def warn(message: str) -> None:
    print(f"spotmorph warm trainer: warning: {message}", file=sys.stderr, flush=True)


def _preload() -> None:
    """What a trainer imports before it can do anything (the bulk of a cold start)."""
    import torch

    from worker_agent.runtime.process.forked import preload

    preload()  # the same imports spotmorph train's launcher does once for its forked ranks
    torch.set_num_threads(1)
    for name in ahead_imports():
        if importlib.util.find_spec(name.partition(".")[0]) is None:
            continue  # not installed: nothing to gain
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken install is the job's to report, if it needs the library at all
            warn(f"cannot import {name} ahead: {exc!r}")


def _tune_allocator() -> bool:
    """As the trainer it becomes will, before the model built ahead allocates (a bad setting is that trainer's
    to report, exit 2, once it has an assignment); True when freed memory is kept."""
    from worker_agent.runtime.errors import NodeUnfit
    from worker_agent.runtime.process import allocator

    try:
        return allocator.keep_freed_memory()
    except NodeUnfit as exc:
        print(f"spotmorph warm trainer: warning: {exc}", file=sys.stderr, flush=True)
        return False


class BuildAbandoned(BaseException):
    """A build ahead ran past its deadline (a BaseException: the user's ``except Exception`` does not stop it)."""


def prepare_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """How long a build ahead may take (``SPOTMORPH_PREPARE_SECONDS``, default 300); a bad value is warned of."""
    raw = environ.get(PREPARE_SECONDS_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_PREPARE_SECONDS
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        warn(f"{PREPARE_SECONDS_ENV}={raw[:40]!r} is not a number of seconds in (0, 86400]; using the default")
        return DEFAULT_PREPARE_SECONDS
    return value


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`BuildAbandoned` in this (main) thread once ``seconds`` have passed."""

    def expired(signum: int, frame: object) -> None:
        raise BuildAbandoned(f"past its deadline of {seconds:g} s ({PREPARE_SECONDS_ENV})")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Preparation:
    """Builds hinted jobs' models ahead onto ``shelf`` (the trainer it becomes starts from it), and remembers
    whose code this process has run."""

    shelf: ModelShelf
    touch: bool = False  # freed memory is kept: touch what a growth's moves will land in (warm_model.touch_memory)
    seconds: float = DEFAULT_PREPARE_SECONDS
    ran: str | None = None  # the code identity of the last job whose entrypoint it ran (code_identity.py)

    def __call__(self, job_json: str) -> None:
        """Build the hinted job's model ahead (its user code runs here, as it would in the trainer), within the
        deadline; a failure is the trainer's to report if the job does come, so it is only noted in the log."""
        started = time.monotonic()
        try:
            from morphing.jobspec import job_spec_from_json

            job = job_spec_from_json(job_json, what="the job to prepare")
            self.ran = code_identity(job)  # before the build: its imports run the job's code
            with deadline(self.seconds):
                built = self.shelf.prepare(job, self.touch)
            if built:
                say(f"built {job.name}'s model ahead in {time.monotonic() - started:.2f} s")
        except BuildAbandoned as exc:
            self.shelf.forget()
            warn(f"abandoned building the model ahead after {time.monotonic() - started:.1f} s: {exc}")
        except (Exception, SystemExit) as exc:  # the user's code may exit: this process still waits for its task
            warn(f"cannot build the model ahead: {exc!r}")

    def fits(self, task: WarmAssignment) -> bool:
        """Whether this process may become ``task``'s trainer: it has run no user code, or only that job's."""
        if self.ran is None:
            return True
        try:
            from morphing.jobspec import job_spec_from_json

            job = job_spec_from_json(read_bounded(task.arguments.job_file, MAX_ASSIGNMENT_BYTES).decode(), what="job")
        except Exception:  # the trainer reports an unreadable job file; this process just does not run it
            return False
        return code_identity(job) == self.ran


def say(message: str) -> None:
    print(f"spotmorph warm trainer: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = WarmArguments.from_argv(argv)
    spool = WarmSpool(args.spool)
    keeps = _tune_allocator()
    _preload()
    from worker_agent.runtime.process import trainer
    from worker_agent.runtime.process.trainer_process import TrainerProcess
    from worker_agent.runtime.process.warm_model import ModelShelf

    spool.ready_file.write_text(str(time.time()))
    preparation = Preparation(ModelShelf(), keeps, prepare_seconds())
    task = wait_for_assignment(spool, args.parent, prepare=preparation)
    if task is None:
        return 0
    assigned_at = time.time()  # the process started long before: this is when the trainer "started"
    take_over(task)
    if not preparation.fits(task):  # the agent hands none such; should one come, it runs in a fresh interpreter
        warn("this process ran another job's code building a model ahead; the trainer starts afresh")
        command = task.arguments.command(sys.executable)
        os.execv(command[0], command)
    process = TrainerProcess(parent=args.parent, assigned_at=assigned_at, models=preparation.shelf)
    trainer.main(task.arguments.to_argv(), process)  # never returns: it ends the process
    return 0


if __name__ == "__main__":
    sys.exit(main())
