"""What each converge command does to this node's trainers: the agent's one dispatch over them.

A new command type in :mod:`worker_agent.agent.converge` fails the type check here until it says what it
does (``assert_never``), instead of being dropped without a word.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, assert_never

from worker_agent.agent.converge import (
    AbortCollectives,
    Command,
    KillTrainer,
    RequestCheckpoint,
    RequestSalvage,
    RequestStop,
    StartTrainer,
)
from worker_agent.agent.gpus import Gpu, device_for_slot

if TYPE_CHECKING:
    from worker_agent.agent.supervisor import LaunchSpec, Supervisor

log = logging.getLogger("spotmorph.agent")


def perform(
    command: Command,
    supervisor: Supervisor,
    gpus: tuple[Gpu, ...],
    slots: int,
    launch: dict[tuple[str, int], LaunchSpec],
    leaving: bool,
) -> None:
    """``gpus``, ``slots``: the node's; ``launch``: what each generation runs; ``leaving``: the node has an eviction
    notice, so its trainers write the stop's checkpoint, not hold it."""
    match command:
        case StartTrainer():
            start(command, supervisor, gpus, slots, launch[(command.key.job_id, command.key.generation)])
        case RequestStop():
            log.info("asking generation %d of %s to stop", command.generation, command.job_id)
            supervisor.request_stop(command.job_id, command.generation, leaving or command.leaving)
        case RequestCheckpoint():
            supervisor.request_checkpoint(command.job_id, command.generation, command.counter)
        case AbortCollectives():
            if supervisor.abort_collectives(command.job_id, command.generation):
                log.info(
                    "generation %d of %s is held: its trainers abort their collectives",
                    command.generation,
                    command.job_id,
                )
        case RequestSalvage():
            log.info("salvage order for generation %d of %s: %s", command.generation, command.job_id, command.order)
            supervisor.request_salvage(command.job_id, command.generation, command.order)
        case KillTrainer():
            if supervisor.end(command.key, command.may_hold):
                log.info("killed %s: %s", command.key, command.reason)
        case _:
            assert_never(command)


def start(command: StartTrainer, supervisor: Supervisor, gpus: tuple[Gpu, ...], slots: int, spec: LaunchSpec) -> None:
    """Start one rank in its slot, on its GPU where the node has them; a slot the node lacks is refused."""
    if not 0 <= command.slot < slots:  # hostile or confused: never two ranks on a GPU
        log.error("not starting %s: slot %d is not one of this node's %d", command.key, command.slot, slots)
        return
    device = device_for_slot(command.slot, gpus)
    on = "" if device is None else f" on cuda:{device}"
    log.info("starting %s in slot %d%s", command.key, command.slot, on)
    supervisor.start(command.key, spec, device)
