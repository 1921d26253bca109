"""The one rule for reports the controller would refuse: a measurement is data, never a reason to stop.

Before a report leaves the agent, each trainer's measurements are fitted to the bounds the controller
checks them against (:mod:`morphing.validation` holds both sides' bounds): a value outside them is
dropped, or clamped where another value implies it (a first step timed after the newest one: the clock
stepped back). Should the controller refuse a report all the same (a bound this agent does not know: a
newer controller), the measurement its refusal names is withheld from that trainer's later reports, and
a refusal that names none withholds every measurement of every trainer. Each is logged once; the agent
keeps beating. What it never does is exit, which would make the node LOST and hand the same job, with
the same measurement, to the next node (a crash loop).

Pure: the daemon passes reports in and logs what comes out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from morphing.validation import MAX_LOSS, MAX_STALL_SECONDS, is_duration, is_loss, is_rate, is_stall, is_time
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.progress import TrainerReport


class Measurement(Enum):
    """What a trainer's report may leave out and still be a report: everything but who it is and its step."""

    EVALUATION = "evaluation"  # eval_step and eval_loss
    TRAINING = "training"  # loss and samples_per_second of the last step
    STEP_TIMES = "step times"  # first_step_at, first_step_seconds and last_step_at
    CHECKPOINT_STALL = "checkpoint stall"  # checkpoint_stall_step and checkpoint_stall_seconds
    HELD_STEP = "held step"  # held_step: the step a rank whose collective failed holds in memory
    LAST_CHECKPOINT = "last checkpoint"  # last_checkpoint_step
    ERROR = "error"  # the trainer's error text


# The controller names a refused field as ``trainers[I].FIELD`` (``trainer_exited.trainer.FIELD`` in a report).
FIELD_MEASUREMENT: Mapping[str, Measurement] = {
    "eval_loss": Measurement.EVALUATION,
    "loss": Measurement.TRAINING,
    "samples_per_second": Measurement.TRAINING,
    "eval_step": Measurement.EVALUATION,
    "first_step_at": Measurement.STEP_TIMES,
    "first_step_seconds": Measurement.STEP_TIMES,
    "last_step_at": Measurement.STEP_TIMES,
    "checkpoint_stall_step": Measurement.CHECKPOINT_STALL,
    "checkpoint_stall_seconds": Measurement.CHECKPOINT_STALL,
    "held_step": Measurement.HELD_STEP,
    "last_checkpoint_step": Measurement.LAST_CHECKPOINT,
    "error": Measurement.ERROR,
}
REFUSED_FIELD = re.compile(r"^trainers\[(\d+)\]\.(\w+)")


@dataclass(frozen=True)
class Adjustment:
    """One measurement of one trainer's report left out (or clamped), and why: what the agent logs."""

    key: TrainerKey
    measurement: Measurement
    why: str

    def __str__(self) -> str:
        return f"{named(self.key)}: {self.why}"


def named(key: TrainerKey) -> str:
    return f"{key.job_id} generation {key.generation} rank {key.rank}"


def fit(report: TrainerReport) -> tuple[TrainerReport, tuple[Adjustment, ...]]:
    """``report`` within the controller's bounds, and what had to change for it."""
    key, changes = report.status.key, list[Adjustment]()
    if report.eval_loss is not None and not is_loss(report.eval_loss):
        why = f"eval_loss {report.eval_loss!r} left out: not a finite number within +-{MAX_LOSS:g}"
        changes.append(Adjustment(key, Measurement.EVALUATION, why))
        report = replace(report, eval_loss=None, eval_step=0)
    elif report.eval_loss is not None and not 1 <= report.eval_step <= report.step:
        why = f"evaluation of step {report.eval_step} left out: the trainer's step is {report.step}"
        changes.append(Adjustment(key, Measurement.EVALUATION, why))
        report = replace(report, eval_loss=None, eval_step=0)
    loss, rate = report.loss, report.samples_per_second
    if (loss is not None and not is_loss(loss)) or (rate is not None and not is_rate(rate)) or report.step < 1:
        if loss is not None or rate is not None:
            why = f"loss {loss!r} and {rate!r} samples/s of step {report.step} left out: out of range"
            changes.append(Adjustment(key, Measurement.TRAINING, why))
        report = replace(report, loss=None, samples_per_second=None)
    first, last = report.first_step_at, report.last_step_at
    if (first is not None and not is_time(first)) or (last is not None and not is_time(last)):
        why = f"step times {first!r}..{last!r} left out: not unix seconds"
        changes.append(Adjustment(key, Measurement.STEP_TIMES, why))
        report = replace(report, first_step_at=None, first_step_seconds=None, last_step_at=None)
    elif first is not None and (last is None or first > last):
        why = f"first_step_at {first!r} clamped to last_step_at {last!r}: the clock stepped back"
        changes.append(Adjustment(key, Measurement.STEP_TIMES, why))
        report = replace(report, first_step_at=last)
    took, first = report.first_step_seconds, report.first_step_at
    if took is not None and (first is None or not is_duration(took) or took > first):
        why = f"first step's {took!r} s left out: not 0..{MAX_STALL_SECONDS:g} s within a first_step_at"
        changes.append(Adjustment(key, Measurement.STEP_TIMES, why))
        report = replace(report, first_step_seconds=None)
    if report.stall_seconds is not None and not (is_stall(report.stall_seconds) and report.stall_step <= report.step):
        why = f"checkpoint stall {report.stall_seconds!r} s at step {report.stall_step} left out: out of range"
        changes.append(Adjustment(key, Measurement.CHECKPOINT_STALL, why))
        report = replace(report, stall_seconds=None, stall_step=0)
    if report.held is not None and not report.step <= report.held.step <= report.step + 1:
        why = f"held step {report.held.step} left out: the trainer's step is {report.step}"
        changes.append(Adjustment(key, Measurement.HELD_STEP, why))
        report = replace(report, held=None)
    if report.last_checkpoint_step is not None and report.last_checkpoint_step > report.step:
        why = f"last checkpoint {report.last_checkpoint_step} left out: past the trainer's step {report.step}"
        changes.append(Adjustment(key, Measurement.LAST_CHECKPOINT, why))
        report = replace(report, last_checkpoint_step=None)
    return report, tuple(changes)


def without(report: TrainerReport, measurements: Iterable[Measurement]) -> TrainerReport:
    """``report`` with ``measurements`` left out."""
    for measurement in measurements:
        if measurement is Measurement.EVALUATION:
            report = replace(report, eval_loss=None, eval_step=0)
        elif measurement is Measurement.TRAINING:
            report = replace(report, loss=None, samples_per_second=None)
        elif measurement is Measurement.STEP_TIMES:
            report = replace(report, first_step_at=None, first_step_seconds=None, last_step_at=None)
        elif measurement is Measurement.CHECKPOINT_STALL:
            report = replace(report, stall_seconds=None, stall_step=0)
        elif measurement is Measurement.HELD_STEP:
            report = replace(report, held=None)
        elif measurement is Measurement.LAST_CHECKPOINT:
            report = replace(report, last_checkpoint_step=None)
        else:
            report = replace(report, error="")
    return report


@dataclass(frozen=True)
class Withheld:
    """What the controller refused so far, withheld from each trainer's later reports."""

    by_trainer: Mapping[TrainerKey, frozenset[Measurement]] = field(default_factory=dict)

    def of(self, key: TrainerKey) -> frozenset[Measurement]:
        return self.by_trainer.get(key, frozenset())

    def adding(self, key: TrainerKey, measurements: Iterable[Measurement]) -> Withheld:
        return Withheld({**self.by_trainer, key: self.of(key) | frozenset(measurements)})


def prepare(reports: Sequence[TrainerReport], withheld: Withheld) -> tuple[list[TrainerReport], tuple[Adjustment, ...]]:
    """The reports as they may be sent: refused measurements withheld, the rest fitted to the bounds."""
    out, changes = [], list[Adjustment]()
    for report in reports:
        fitted, adjusted = fit(without(report, withheld.of(report.status.key)))
        out.append(fitted)
        changes.extend(adjusted)
    return out, tuple(changes)


def after_refusal(detail: str, sent: Sequence[TrainerReport], withheld: Withheld) -> tuple[Withheld, str]:
    """What to withhold after the controller refused a heartbeat carrying ``sent`` with ``detail``; and the log line.

    A refusal naming a measurement of one trainer withholds that one; any other withholds every
    measurement of every trainer sent (the bare report: who, running, step, exit code). A refusal of
    the bare report leaves nothing to withhold: the agent goes on beating, and its trainers stop when
    their lease lapses, as on a node cut off from the controller.
    """
    match = REFUSED_FIELD.match(detail)
    if match is not None and int(match.group(1)) < len(sent) and match.group(2) in FIELD_MEASUREMENT:
        key, measurement = sent[int(match.group(1))].status.key, FIELD_MEASUREMENT[match.group(2)]
        if measurement not in withheld.of(key):
            line = f"the controller refused {match.group(2)} of {named(key)} ({detail})"
            return withheld.adding(key, [measurement]), f"{line}: its {measurement.value} is withheld from now on"
    bare = withheld
    for report in sent:
        bare = bare.adding(report.status.key, Measurement)
    if bare == withheld:
        return withheld, f"the controller refused even bare reports ({detail}); beating on until the lease decides"
    return bare, f"the controller refused a report ({detail}): every measurement is withheld from now on"
