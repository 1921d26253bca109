"""A generation meets its peers and takes the step a past generation held in memory: the rendezvous, the exchange,
and the agent's abort that ends a generation before it loaded that step, which the process then holds again
(:meth:`worker_agent.runtime.process.trainer_process.TrainerProcess.next_generation`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from morphing.jobspec import JobSpec
from morphing.layout import Layout
from morphing.transfer import HeldSkipCause
from worker_agent.contract import ControlDir, HeldStateSkipped, TrainerArguments, TrainerStarted
from worker_agent.runtime.errors import GenerationAbandoned
from worker_agent.runtime.link.control import ProgressLog
from worker_agent.runtime.morph import held as held_mod
from worker_agent.runtime.morph.held import Held
from worker_agent.runtime.process.trainer_setup import process_started_at, rendezvous, warn

if TYPE_CHECKING:
    from worker_agent.runtime.pipeline.engine import StageRunner
    from worker_agent.runtime.process.trainer_process import TrainerProcess


@contextlib.contextmanager
def handed_step(
    cfg: TrainerArguments, control: ControlDir | None, process: TrainerProcess
) -> Iterator[Callable[[], bool]]:
    """While a generation handed a step held in memory has not loaded it: its agent's abort (the controller ended
    the generation: a peer never came, or failed to start) severs the rendezvous or the exchange at once, and the
    generation ends with :class:`GenerationAbandoned`, the process keeping the step for the next one
    (:meth:`TrainerProcess.next_generation`). Yields whether that abort came."""
    from worker_agent.runtime.morph.salvage import AbortWatch

    handed = cfg.held is not None and process.held is not None
    watch = AbortWatch(control if handed else None, process.communicators)
    watch.start()
    failure: Exception | None = None
    try:
        yield watch.fired.is_set
    except Exception as exc:
        failure = exc
    finally:
        watch.stop(wait=True)  # a cut under way lands before the verdict, not in the first step
    if watch.fired.is_set():  # also when it came after the last collective of the block: the peers were cut
        raise abandoned(cfg, process, failure) from failure
    if failure is not None:
        raise failure


def abandoned(cfg: TrainerArguments, process: TrainerProcess, failure: Exception | None) -> GenerationAbandoned:
    """Why the generation ended: its agent's abort, and whether the process holds the step again (not once its
    stage began to load it: the stage adopts the tensors)."""
    assert cfg.held is not None  # the abort is watched for only while a held step is handed
    named = f"step {cfg.held.step} of generation {cfg.held.generation}"
    cause = f" ({type(failure).__name__}: {str(failure)[:200]})" if failure is not None else ""
    if process.held is None:
        return GenerationAbandoned(
            f"generation {cfg.generation} was aborted by its agent while it loaded {named}{cause}"
        )
    held = f"before it took {named}, which this process holds again for the next generation"
    return GenerationAbandoned(f"generation {cfg.generation} was aborted by its agent {held}{cause}")


def meet(
    cfg: TrainerArguments,
    job: JobSpec,
    layout: Layout,
    progress: ProgressLog,
    assigned_at: float | None,
    abandoned: Callable[[], bool] = lambda: False,
) -> Any:
    """The rendezvous (the store it returns must be kept), then ``TrainerStarted``."""
    ready_at = time.time()  # torch imported, model built: what a cold start costs before the rendezvous
    store = rendezvous(cfg, layout.world_size, job.timeout_seconds, abandoned)
    progress.emit(
        TrainerStarted(
            layout=layout.describe(),
            process_started_at=assigned_at or process_started_at(),
            ready_at=ready_at,
            warm=assigned_at is not None,
        )
    )
    return store


def exchange_held(
    cfg: TrainerArguments,
    job: JobSpec,
    layout: Layout,
    runner: StageRunner,
    progress: ProgressLog,
    held: Held | None,
) -> held_mod.Outcome | None:
    """The exchange of the step a past generation held in memory (a collective, when the assignment names one).
    Nothing of ``held`` changes (peers are sent copies): until the stage loads it, the process may hold it again."""

    named = cfg.held
    if not named:
        return None

    def memory_skipped(cause: HeldSkipCause, reason: str) -> None:
        warn(f"the state generation {named.generation} held in memory is not used: {reason}")
        progress.emit(HeldStateSkipped(reason=reason, cause=cause.value))

    return held_mod.take(held, cfg, layout, job.identity_hash(), runner, memory_skipped)
