"""The trainer process: one rank of a layout, started by ``spotmorph train`` or by a worker agent.

``python -m worker_agent.runtime.process.trainer`` with the arguments of
:class:`worker_agent.contract.TrainerArguments`; it reports :mod:`worker_agent.contract.events` and ends
with an :class:`worker_agent.contract.ExitCode`. The generation prefixes every rendezvous key, so a
trainer of generation g never meets one of g+1. The job's device is resolved before the rendezvous
(CUDA asked for on a node without it exits 2 at once), and a rank on a GPU uses ``cuda:<device_index>``.
"""

from __future__ import annotations

import os
import sys
import traceback

from morphing.errors import UserInputError
from worker_agent.contract import (
    ExitCode,
    TrainerArguments,
    TrainerFailed,
)
from worker_agent.runtime.errors import (
    CheckpointError,
    CheckpointWriteFailed,
    FenceError,
    GenerationAbandoned,
    NodeUnfit,
)
from worker_agent.runtime.link.control import ProgressLog
from worker_agent.runtime.link.gated_store import PortTaken
from worker_agent.runtime.numerics.exact import deterministic_or_refused
from worker_agent.runtime.process.trainer_process import TrainerProcess


def train(process: TrainerProcess, cfg: TrainerArguments, progress: ProgressLog) -> ExitCode:
    """One generation: set up (:mod:`worker_agent.runtime.process.generation`), then its steps (:mod:`.step_loop`)."""
    from worker_agent.runtime.process import allocator, generation, step_loop

    allocator.keep_freed_memory()  # before the model's tensors: every step then reuses what the last one freed
    with deterministic_or_refused():
        return step_loop.run(generation.start(cfg, progress, process))


def run(process: TrainerProcess, cfg: TrainerArguments) -> ExitCode:
    """One generation of this rank: its exit code, with every failure reported as an event first."""
    progress = ProgressLog(cfg.progress_file, cfg.rank, cfg.generation)
    try:
        return train(process, cfg, progress)
    except PortTaken as exc:  # not this trainer's failure: the controller starts the generation on another port
        print(f"spotmorph trainer (rank {cfg.rank}): error: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="port_taken", message=str(exc)))
        return ExitCode.USER_ERROR
    except UserInputError as exc:  # "node": this node cannot run the job as asked; "input": no node can
        print(f"spotmorph trainer (rank {cfg.rank}): error: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="node" if isinstance(exc, NodeUnfit) else "input", message=str(exc)))
        return ExitCode.USER_ERROR
    except GenerationAbandoned as exc:  # its agent ended it before it took its held step, which it holds again
        print(f"spotmorph trainer (rank {cfg.rank}): stopping: {exc}", file=sys.stderr, flush=True)
        progress.emit(TrainerFailed(kind="abort", message=str(exc)))
        return ExitCode.ABORTED
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


def main(argv: list[str] | None = None, process: TrainerProcess | None = None) -> int:
    """Run generations until one ends without state kept for the next (or no next one comes), then exit."""
    process = process or TrainerProcess(parent=os.getppid())
    cfg: TrainerArguments | None = TrainerArguments.from_argv(argv)
    code = ExitCode.SUCCEEDED
    while cfg is not None:
        code = run(process, cfg)
        cfg = process.next_generation(cfg, code)
    sys.stdout.flush()
    sys.stderr.flush()
    process.communicators.abort()
    # No destructors: a process group whose peer died can hang in teardown.
    os._exit(code)


if __name__ == "__main__":
    main()
