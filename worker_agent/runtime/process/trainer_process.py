"""What a trainer process holds across its generations (a planned morph through memory keeps the process).

Kept in one object the process owns and hands to each generation, not in module globals: the state a
generation keeps for the next, the model it built, the NCCL communicators to abort before exiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from worker_agent.contract import ExitCode, TrainerArguments
from worker_agent.runtime.link.spool import take_over
from worker_agent.runtime.morph import held as held_mod
from worker_agent.runtime.morph.held import Held
from worker_agent.runtime.numerics.dropout import Masks
from worker_agent.runtime.pipeline.comm import Communicators
from worker_agent.runtime.process.warm_model import ModelShelf


@dataclass
class TrainerProcess:
    """What one trainer process holds across its generations, the state a module must not: owned here and handed
    to each generation (:mod:`worker_agent.runtime.process.generation`) and its steps (:mod:`.step_loop`)."""

    parent: int  # the agent (or the warm trainer's agent): a holder exits when it is gone
    assigned_at: float | None = None  # a warm trainer's: its process started long before, so the trainer "started" then
    held: Held | None = None  # what the last generation kept, until this one has loaded it
    kept: Held | None = None  # what the generation now running keeps for the next
    models: ModelShelf = field(default_factory=ModelShelf)  # the model a past generation (or a build ahead) made
    communicators: Communicators = field(default_factory=Communicators)  # aborted before the process exits
    masks: Masks = field(default_factory=Masks)  # dropout's caches and compiled kernels, checked once per process

    def keep(self, kept: Held) -> None:
        """The generation running keeps ``kept`` (its stage at its stop) for the next one."""
        self.kept = kept

    def forget_held(self) -> None:
        """The generation has loaded what the last one held (its stage adopted the tensors): let it go."""
        self.held = None

    def next_generation(self, cfg: TrainerArguments, code: ExitCode) -> TrainerArguments | None:
        """After a generation ended with ``code``: the arguments of the next one this process runs with the state
        it keeps (it held it until its agent assigned it), or None when the process ends.

        A generation that stopped keeps its stage at the stop. One that ended any other way before it took the step
        it was handed (``held``: its rendezvous failed or was aborted, a peer's start failed) holds that step again,
        as it was: the next generation is named it once more, and a morph that failed to start loses no step."""
        kept, self.kept = self.kept, None
        if cfg.hold_spool is None:
            return None
        if code == ExitCode.SUCCEEDED and kept is not None:
            task = held_mod.hold(cfg.hold_spool, kept, self.parent, self.communicators)
        elif code != ExitCode.SUCCEEDED and self.held is not None:
            kept = self.held
            task = held_mod.hold(cfg.hold_spool, kept, self.parent, self.communicators, int(code))
        else:
            return None
        if task is None:
            return None
        self.assigned_at = time.time()
        take_over(task)
        self.held = kept  # dropped once the next generation has loaded it
        return task.arguments
