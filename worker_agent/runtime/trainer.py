"""The trainer process: one rank of a layout, started by ``spotmorph train`` or by a worker agent.

``python -m worker_agent.runtime.trainer`` with the arguments of
:class:`worker_agent.contract.TrainerArguments`; it reports :mod:`worker_agent.contract.events` and ends
with an :class:`worker_agent.contract.ExitCode`. The generation prefixes every rendezvous key, so a
trainer of generation g never meets one of g+1. The job's device is resolved before the rendezvous
(CUDA asked for on a node without it exits 2 at once), and a rank on a GPU uses ``cuda:<device_index>``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from morphing.errors import UserInputError
from worker_agent.contract import (
    ExitCode,
    TrainerArguments,
    TrainerFailed,
)
from worker_agent.runtime import held as held_mod
from worker_agent.runtime.control import ProgressLog
from worker_agent.runtime.errors import CheckpointError, CheckpointWriteFailed, FenceError, NodeUnfit
from worker_agent.runtime.exact import deterministic_or_refused
from worker_agent.runtime.gated_store import PortTaken
from worker_agent.runtime.held import Held
from worker_agent.runtime.spool import take_over

# Set by a warm trainer (worker_agent.runtime.warm) when its assignment arrived: the process was started
# long before, so this is when the trainer "started".
ASSIGNED_AT: float | None = None
# What this process kept after its last generation stopped (a planned morph through memory), and what the
# generation that just stopped keeps for the next one (worker_agent.runtime.held).
HELD: Held | None = None
KEPT: Held | None = None
PARENT = os.getppid()  # the agent (or the warm trainer's agent): a holder exits when it is gone


def train(cfg: TrainerArguments, progress: ProgressLog) -> ExitCode:
    """One generation: set up (:mod:`worker_agent.runtime.generation`), then its steps (:mod:`.step_loop`)."""
    from worker_agent.runtime import allocator, generation, step_loop

    allocator.keep_freed_memory()  # before the model's tensors: every step then reuses what the last one freed
    with deterministic_or_refused():
        return step_loop.run(generation.start(cfg, progress, HELD, _forget_held, ASSIGNED_AT), _keep)


def _keep(kept: Held) -> None:
    global KEPT
    KEPT = kept


def _forget_held() -> None:
    global HELD
    HELD = None


def run(cfg: TrainerArguments) -> ExitCode:
    """One generation of this rank: its exit code, with every failure reported as an event first."""
    progress = ProgressLog(cfg.progress_file, cfg.rank, cfg.generation)
    try:
        return train(cfg, progress)
    except PortTaken as exc:  # not this trainer's failure: the controller starts the generation on another port
        print(f"spotmorph trainer (rank {cfg.rank}): error: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="port_taken", message=str(exc)))
        return ExitCode.USER_ERROR
    except UserInputError as exc:  # "node": this node cannot run the job as asked; "input": no node can
        print(f"spotmorph trainer (rank {cfg.rank}): error: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="node" if isinstance(exc, NodeUnfit) else "input", message=str(exc)))
        return ExitCode.USER_ERROR
    except CheckpointWriteFailed as exc:
        print(f"spotmorph trainer (rank {cfg.rank}): error: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="checkpoint", message=str(exc)))
        return ExitCode.CHECKPOINT_NOT_WRITTEN
    except FenceError as exc:
        print(f"spotmorph trainer (rank {cfg.rank}): stopping: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="fenced", message=str(exc)))
        return ExitCode.FENCED
    except CheckpointError as exc:
        # Rank 0 checked sizes and checksums, so a file changed since or is no layer file at all (a checksum
        # is only as trustworthy as the manifest that lists it).
        message = f"checkpoint cannot be loaded: {exc}; move that step directory aside to resume from the one before"
        print(f"spotmorph trainer (rank {cfg.rank}): error: {message}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="checkpoint_damaged", message=message))
        return ExitCode.ABORTED
    except BaseException as exc:
        traceback.print_exc()
        print(f"spotmorph trainer (rank {cfg.rank}): aborting: {exc!r}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="abort", message=repr(exc)))
        return ExitCode.ABORTED


def main(argv: list[str] | None = None) -> int:
    """Run generations until one ends without state kept for the next (or no next one comes), then exit."""
    global ASSIGNED_AT, HELD, KEPT
    cfg = TrainerArguments.from_argv(argv)
    while True:
        code = run(cfg)
        kept, KEPT = KEPT, None
        if code != ExitCode.SUCCEEDED or kept is None or cfg.hold_spool is None:
            break
        task = held_mod.hold(cfg.hold_spool, kept, PARENT)
        if task is None:
            break
        ASSIGNED_AT = time.time()
        take_over(task)
        cfg, HELD, kept = task.arguments, kept, None  # HELD is dropped once the exchange is done
    sys.stdout.flush()
    sys.stderr.flush()
    if "worker_agent.runtime.comm" in sys.modules:
        from worker_agent.runtime.comm import abort_communicators

        abort_communicators()
    # No destructors: a process group whose peer died can hang in teardown.
    os._exit(code)


if __name__ == "__main__":
    main()
