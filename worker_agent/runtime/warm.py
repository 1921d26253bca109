"""A warm trainer: a process that has imported torch and the runtime and waits for its assignment.

``python -m worker_agent.runtime.warm`` with :class:`worker_agent.contract.WarmArguments`. Once its
imports are done (torch, the runtime, and the model libraries it supports when installed) it writes its
spool's ready file; it then polls for the assignment file (a :class:`worker_agent.contract.WarmAssignment`,
written atomically by the agent's supervisor), points its stdout and stderr at the trainer's log and runs
:func:`worker_agent.runtime.trainer.main` with those arguments, exactly as a cold ``python -m
worker_agent.runtime.trainer`` would. A morph then pays no interpreter start and no ``import torch``. It
exits by itself when the agent that started it is gone (its parent pid changes), so a dead VM leaves nothing
behind.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import time
from collections.abc import Mapping

from worker_agent.contract import WarmArguments, WarmSpool
from worker_agent.runtime.spool import take_over, wait_for_assignment

# Libraries the runtime takes models from (hf_adapter), imported ahead when installed: a Hugging Face model's
# entrypoint spends seconds in ``transformers.modeling_utils`` (2.2 s of 2.4 s for GPT-2's classes, measured
# here), which a growth onto a new VM would otherwise pay inside the morph's pause.
MODEL_LIBRARIES = ("transformers.modeling_utils",)
# The node's operator may name others, comma-separated, or none (an empty value): a node that never trains a
# Hugging Face model saves that import's 2 s of CPU and its memory in every warm trainer and zygote.
IMPORTS_ENV = "SPOTMORPH_WARM_IMPORTS"
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

    from worker_agent.runtime.forked import preload

    preload()  # the same imports spotmorph train's launcher does once for its forked ranks
    torch.set_num_threads(1)
    for name in ahead_imports():
        if importlib.util.find_spec(name.partition(".")[0]) is None:
            continue  # not installed: nothing to gain
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken install is the job's to report, if it needs the library at all
            warn(f"cannot import {name} ahead: {exc!r}")


def _tune_allocator() -> None:
    """As the trainer it becomes will, before the model built ahead allocates (a bad setting is that trainer's
    to report, exit 2, once it has an assignment)."""
    from worker_agent.runtime import allocator
    from worker_agent.runtime.errors import NodeUnfit

    try:
        allocator.keep_freed_memory()
    except NodeUnfit as exc:
        print(f"spotmorph warm trainer: warning: {exc}", file=sys.stderr, flush=True)


def _prepare(job_json: str) -> None:
    """Build the hinted job's model ahead (its user code runs here, as it would in the trainer); a failure is
    the trainer's to report if the job does come, so it is only noted in the warm trainer's log."""
    started = time.monotonic()
    try:
        from morphing.jobspec import job_spec_from_json
        from worker_agent.runtime import warm_model

        job = job_spec_from_json(job_json, what="the job to prepare")
        if warm_model.prepare(job):
            print(
                f"spotmorph warm trainer: built {job.name}'s model ahead in {time.monotonic() - started:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    except (Exception, SystemExit) as exc:  # the user's code may exit: this process still waits for its assignment
        print(f"spotmorph warm trainer: warning: cannot build the model ahead: {exc!r}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = WarmArguments.from_argv(argv)
    spool = WarmSpool(args.spool)
    _tune_allocator()
    _preload()
    spool.ready_file.write_text(str(time.time()))
    task = wait_for_assignment(spool, args.parent, prepare=_prepare)
    if task is None:
        return 0
    assigned_at = time.time()
    take_over(task)
    from worker_agent.runtime import trainer

    trainer.ASSIGNED_AT = assigned_at
    trainer.main(task.arguments.to_argv())  # never returns: it ends the process
    return 0


if __name__ == "__main__":
    sys.exit(main())
