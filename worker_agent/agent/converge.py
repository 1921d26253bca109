"""The agent's decisions: from the desired assignment and the trainers it observes, to commands.

Pure: no processes, no sockets, no clock. The shell (:mod:`worker_agent.agent.daemon`) performs the
commands with :mod:`worker_agent.agent.supervisor`. Generations are fencing tokens: an assignment
older than one already accepted is ignored, and a trainer of any generation other than the desired
one is killed before a trainer of the desired generation starts, so a stale trainer can never
share a node, a slot or a rendezvous with the new generation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Action = Literal["run", "stop", "abort", "hold", "idle"]


@dataclass(frozen=True)
class Assignment:
    """What the controller wants this node to run (``idle``: nothing)."""

    job_id: str
    generation: int
    action: Action
    ranks: tuple[int, ...] = ()
    checkpoint_request: int = 0  # the controller bumps it to ask for a checkpoint at the next step boundary
    slots: tuple[int, ...] = ()  # the slot of each rank, same order (empty: the i-th rank takes slot i)
    salvage: str | None = None  # with "hold": the salvage order (SalvageOrder JSON) for the holding trainers
    leaving: bool = False  # with "stop": the node leaves the job at this stop (the controller gave it to another job)
    await_leavers: bool = False  # with "stop": the leaving nodes start it; this node's trainers stop with them

    def slot_of(self, position: int) -> int:
        """The slot of ``ranks[position]``; by position when the controller sent no (or a mismatched) list."""
        return self.slots[position] if len(self.slots) == len(self.ranks) else position


@dataclass(frozen=True)
class TrainerKey:
    job_id: str
    generation: int
    rank: int


@dataclass(frozen=True)
class TrainerStatus:
    key: TrainerKey
    running: bool
    exit_code: int | None = None
    stop_requested: bool = False


@dataclass(frozen=True)
class StartTrainer:
    key: TrainerKey
    slot: int  # which of the node's slots (and so which GPU) the rank runs on


@dataclass(frozen=True)
class RequestStop:
    """Ask every trainer of a generation to stop at the next common step boundary and checkpoint (``leaving``: the
    controller takes this node off the job at the stop, so its ranks hand their layers over, as on a notice)."""

    job_id: str
    generation: int
    leaving: bool = False


@dataclass(frozen=True)
class RequestCheckpoint:
    """Pass the controller's checkpoint request counter on to a generation's trainers."""

    job_id: str
    generation: int
    counter: int


@dataclass(frozen=True)
class KillTrainer:
    key: TrainerKey
    reason: str
    may_hold: bool = False  # the node goes on with this job: a trainer holding a step of it may give up and keep it


@dataclass(frozen=True)
class RequestSalvage:
    """Pass the controller's salvage order on to a generation's holding trainers."""

    job_id: str
    generation: int
    order: str  # SalvageOrder JSON


@dataclass(frozen=True)
class AbortCollectives:
    """The controller holds a generation (a rank is lost): its running trainers abandon the step in flight
    now, aborting their communicators, instead of waiting out ``peer_timeout_seconds`` on the lost peer."""

    job_id: str
    generation: int


Command = StartTrainer | RequestStop | RequestCheckpoint | RequestSalvage | AbortCollectives | KillTrainer


def accept(current: Assignment | None, incoming: Assignment) -> bool:
    """Whether ``incoming`` may replace ``current``: never go back to an older generation of a job."""
    if current is None or current.job_id != incoming.job_id:
        return True
    return incoming.generation >= current.generation


def converge(desired: Assignment | None, trainers: Iterable[TrainerStatus], noticed: bool = False) -> list[Command]:
    """Commands that move the observed trainers toward ``desired`` (``noticed``: this node has an eviction notice, so
    it leaves at any stop: it starts one itself even where the controller awaits the leaving nodes')."""
    trainers = list(trainers)
    commands: list[Command] = []
    wanted = desired if desired is not None and desired.action != "idle" else None
    stale_running = False
    for trainer in trainers:
        if not trainer.running:
            continue
        key = trainer.key
        if wanted is None or (key.job_id, key.generation) != (wanted.job_id, wanted.generation):
            same_job = wanted is not None and wanted.job_id == key.job_id
            commands.append(KillTrainer(key, _why_stale(key, wanted), may_hold=same_job))
            stale_running = True
        elif wanted.action == "abort":
            commands.append(KillTrainer(key, f"generation {key.generation} aborted by the controller", may_hold=True))
    stoppable = (t.running and not t.stop_requested and _same(t.key, wanted) for t in trainers if wanted)
    if wanted is not None and wanted.action == "stop" and (noticed or not wanted.await_leavers) and any(stoppable):
        commands.append(RequestStop(wanted.job_id, wanted.generation, wanted.leaving))
    if wanted is not None and wanted.action == "hold":
        if any(t.running and _same(t.key, wanted) for t in trainers):
            commands.append(AbortCollectives(wanted.job_id, wanted.generation))
        if wanted.salvage is not None:
            commands.append(RequestSalvage(wanted.job_id, wanted.generation, wanted.salvage))
    if wanted is not None and wanted.action == "run" and not stale_running:
        known = {t.key for t in trainers}
        for position, rank in enumerate(wanted.ranks):
            key = TrainerKey(wanted.job_id, wanted.generation, rank)
            if key not in known:
                commands.append(StartTrainer(key, wanted.slot_of(position)))
        if wanted.checkpoint_request > 0:
            commands.append(RequestCheckpoint(wanted.job_id, wanted.generation, wanted.checkpoint_request))
    return commands


def _same(key: TrainerKey, assignment: Assignment) -> bool:
    return (key.job_id, key.generation) == (assignment.job_id, assignment.generation)


def _why_stale(key: TrainerKey, wanted: Assignment | None) -> str:
    if wanted is None:
        return f"job {key.job_id} is no longer assigned to this node"
    if key.job_id != wanted.job_id:
        return f"node now runs job {wanted.job_id}"
    return f"generation {key.generation} is stale; the controller wants generation {wanted.generation}"
