"""What a generation does at a step boundary, decided once, purely, from what the ranks agreed.

Every rank says what it knows (:class:`Said`), one all-reduce sums it (:class:`Agreed`, the same on every
rank), and :func:`decide` turns that and the rank's facts into a :class:`Boundary`: go on, fenced, lease
lapsed, stop or finish, and on the way report the step, evaluate, hand off, write a checkpoint, hold the stage.
The step loop (:mod:`worker_agent.runtime.process.step_loop`) only carries the value out, as TorchFT's ``should_commit``
is one decision with a thin executor. What every rank does alike (:attr:`Boundary.collective`) depends on the
agreed sums and the facts every rank shares (:class:`Shared`) only, never on the rank's own (:class:`Own`), so
no rank can take a branch its peers do not: a collective one takes alone would wait for peers forever.
No torch: the decision is tested without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class Said:
    """What one rank says at a step boundary."""

    stop: bool  # its node was asked to stop (a planned morph)
    loss_share: float  # its part of the last step's loss (the global batch's, summed over the ranks)
    checkpoint_request: float  # rank 0: the newest checkpoint request it saw (0: none)
    lease_lapsed: bool  # its agent stopped renewing its lease
    fenced: bool  # the checkpoint directory's fence is past this generation
    cannot_hold: bool  # it may not keep its stage in memory (the job morphs through the disk)
    leaving: bool  # its node leaves with this stop (an eviction notice)
    snapshot_running: bool = False  # its peer snapshot in flight still streams (morph/snapshots.py)
    snapshot_failed: bool = False  # ... or failed: a copy it receives did not arrive whole

    def slots(self) -> tuple[float, ...]:
        """The all-reduce's slots, in :class:`Agreed`'s order."""
        flags = (self.stop, self.loss_share, self.checkpoint_request, self.lease_lapsed, self.fenced)
        snapshot = (float(self.snapshot_running), float(self.snapshot_failed))
        return (*map(float, flags), float(self.cannot_hold), float(self.leaving), *snapshot)


@dataclass(frozen=True)
class Agreed:
    """The world's sums of what every rank said: the same on every rank, so every rank takes the same branch."""

    stops: float
    loss: float
    checkpoint_request: float
    lapsed: float
    fenced: float
    cannot_hold: float
    leaving: float
    snapshot_running: float = 0.0  # ranks whose snapshot in flight still streams: none, and it commits ...
    snapshot_failed: float = 0.0  # ... unless one failed: then every rank drops it

    @property
    def stopping(self) -> bool:
        return self.stops > 0

    @property
    def ends_at_once(self) -> bool:
        """Fenced or lapsed: every rank leaves at this boundary, with nothing written."""
        return self.fenced > 0 or self.lapsed > 0


@dataclass(frozen=True)
class Shared:
    """Facts at a boundary that every rank of the generation has alike (set up alike, or agreed)."""

    step: int  # steps completed
    first_step: int  # where the generation resumed
    steps: int  # the job's last step
    eval_interval: int
    checkpoint_interval: int
    world_size: int
    leavers: float  # ranks whose node leaves with an agreed stop (counted again once the stop is agreed)
    requested: bool  # rank 0's checkpoint request counter, agreed, is one not yet acted on
    already_written: int | None  # a step the generation resumed from, already in the directory
    durable_due: int | None  # resumed from memory only: the step written first, in the background


@dataclass(frozen=True)
class Own:
    """This rank's own facts: they may differ between ranks, so they decide only what the rank does alone."""

    can_hold: bool  # it may keep its stage in memory (the job morphs through memory, it has a hold spool)
    leaving: bool  # its node leaves with this stop


class Kind(Enum):
    """How the boundary ends, or that it does not."""

    GO_ON = "go on"  # train the next step
    FENCED = "fenced"  # a newer generation raised the fence: exit FENCED, nothing written
    LEASE_LAPSED = "lease lapsed"  # some rank's agent stopped renewing its lease: exit LEASE_EXPIRED
    STOP = "stop"  # an agreed stop (a planned morph): TrainingStopped
    FINISH = "finish"  # the job's last step: TrainingFinished


class Write(Enum):
    """Whether the boundary writes a checkpoint of its step."""

    NONE = "none"
    NOW = "now"
    IF_HAND_OFF_FAILS = "if the hand-off fails"  # the stop goes through memory unless a handed layer arrives damaged


@dataclass(frozen=True)
class Boundary:
    """What one boundary does, in the executor's order: report, evaluate, hand off, write, hold, then end."""

    kind: Kind
    report: bool = False  # StepCompleted for the step just trained
    evaluate: bool = False
    hand_off: bool = False  # leaving ranks hand what only they hold to staying ones (a collective)
    write: Write = Write.NONE
    background: bool = False  # the write is the durable one due after a morph through memory
    hold: bool = False  # this rank keeps its stage for the next generation (its own decision)

    @property
    def ends(self) -> bool:
        return self.kind is not Kind.GO_ON

    @property
    def finishing(self) -> bool:
        """The generation ends here with success (its last write waited for)."""
        return self.kind in (Kind.STOP, Kind.FINISH)

    @property
    def collective(self) -> tuple[Kind, bool, bool, bool, Write, bool]:
        """Everything every rank must do alike (each part is, or brackets, a collective)."""
        return self.kind, self.report, self.evaluate, self.hand_off, self.write, self.background

    def writes(self, handed_off: bool) -> bool:
        """Whether the step is written, once the hand-off (if any) succeeded (``handed_off``) or not."""
        return self.write is Write.NOW or (self.write is Write.IF_HAND_OFF_FAILS and not handed_off)


def decide(agreed: Agreed, shared: Shared, own: Own) -> Boundary:
    """The boundary's one decision. A stop before the last step with every rank able to hold and one staying
    goes through memory: leaving ranks hand off, and nothing is written unless that fails."""
    if agreed.fenced > 0:
        return Boundary(Kind.FENCED)
    if agreed.lapsed > 0:
        return Boundary(Kind.LEASE_LAPSED)
    step = shared.step
    finishing = agreed.stopping or step >= shared.steps
    kind = Kind.STOP if agreed.stopping else Kind.FINISH if finishing else Kind.GO_ON
    trained = step > shared.first_step
    evaluate = trained and shared.eval_interval > 0 and step % shared.eval_interval == 0
    early = agreed.stopping and step < shared.steps  # a next generation trains on from here
    in_memory = early and agreed.cannot_hold == 0 and shared.leavers < shared.world_size
    hand_off = in_memory and shared.leavers > 0
    write = _write(shared, finishing, in_memory, hand_off)
    hold = early and own.can_hold and not own.leaving
    return Boundary(kind, trained, evaluate, hand_off, write, step == shared.durable_due, hold)


def _write(shared: Shared, finishing: bool, in_memory: bool, hand_off: bool) -> Write:
    """A request, the durable step after a morph through memory, and (unless the stop goes through memory) the
    end or an interval's step are written; never a step the directory has already."""
    step = shared.step
    if step == shared.already_written:
        return Write.NONE
    if shared.requested or step == shared.durable_due:
        return Write.NOW
    interval = shared.checkpoint_interval > 0 and step % shared.checkpoint_interval == 0
    if not (finishing or interval):
        return Write.NONE
    if not in_memory:
        return Write.NOW
    return Write.IF_HAND_OFF_FAILS if hand_off else Write.NONE
