"""What the scheduler's decisions record: on-demand capacity asked for and given back (with the cause, a
``scheduler.deadlines.CapacityCause`` value, and the numbers behind it), and the planner's predictions checked
against measured step times (:mod:`controller.core.reconcile.on_demand`, :mod:`controller.core.reconcile.learn`).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.eventlog.fact import Fact
from controller.eventlog.kinds import EventKind


@dataclass(frozen=True)
class OnDemandRequested(Fact):
    """The job is to hold ``gpus`` on-demand GPUs (``previous`` before): the forecast says its deadline is at risk
    on spot alone. ``spot_samples_per_second`` is its liveput on the spot GPUs it gets, ``with_on_demand_...`` with
    those on-demand GPUs too; ``finish_seconds`` how long its work left takes on spot alone at that rate."""

    kind = EventKind.ON_DEMAND_REQUESTED
    gpus: int
    previous: int
    cause: str
    deadline_in_seconds: float
    remaining_samples: float
    spot_gpus: int
    spot_samples_per_second: float
    with_on_demand_samples_per_second: float
    finish_seconds: float | None
    eviction_per_hour: float


@dataclass(frozen=True)
class OnDemandReleased(Fact):
    """On-demand nodes of the job given back (``gpus`` of them): spot alone meets the deadline again, or the job
    ended. A node that still runs the job is given back once the job has moved off it."""

    kind = EventKind.ON_DEMAND_RELEASED
    nodes: list[str]
    gpus: int
    cause: str
    detail: str


@dataclass(frozen=True)
class StepTimeChecked(Fact):
    """Generation ``generation`` on ``gpus`` GPUs measured ``measured_seconds`` a step; the planner predicted
    ``predicted_seconds``, and ``corrected_seconds`` with the correction learned from the morphs before it.
    Errors are relative to the measured time."""

    kind = EventKind.STEP_TIME_CHECKED
    generation: int
    gpus: int
    predicted_seconds: float
    corrected_seconds: float
    measured_seconds: float
    error_before: float
    error_after: float


@dataclass(frozen=True)
class GrowthUndone(Fact):
    """The growth to generation ``generation`` made the job slower: it goes back off ``nodes``, which it is not
    grown onto again."""

    kind = EventKind.GROWTH_UNDONE
    generation: int
    nodes: list[str]
    before_samples_per_second: float
    after_samples_per_second: float
    detail: str


@dataclass(frozen=True)
class JobShrunk(Fact):
    """The job gives up spot GPUs (``from_gpus`` to ``to_gpus``) to ``for_job``: a higher-priority job gains more
    over the horizon than it loses, both morphs paid (``cause`` ``priority``), or ``for_job`` waited the starvation
    bound (``starvation``). It stops and goes on with ``kept`` (none: it writes its step and queues)."""

    kind = EventKind.JOB_SHRUNK
    from_gpus: int
    to_gpus: int
    cause: str
    for_job: str
    given_up: list[str]
    kept: list[str]
