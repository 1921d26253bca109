"""The agent's decisions about talking to the controller: pure functions of what it knows, time injected.

Which facts are urgent enough to push at once, when to tell the platform it may evict, how long to wait
before the next heartbeat, how far to back off, and what a failed call means. The loop
(:mod:`worker_agent.agent.daemon`) performs the answers; keeping them here makes them testable without
a server, a clock or a sleep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from protos.reasons import NOT_LEADER, REGISTER_AGAIN
from worker_agent.agent.converge import Assignment, TrainerKey, TrainerStatus
from worker_agent.agent.progress import TrainerReport

FIRST_REGISTER_BACKOFF_SECONDS = 0.2


class Failure(Enum):
    """What a failed call to the controller means for the agent."""

    RETRY = "retry"  # the controller is unreachable or overloaded: keep training, try again later
    NOT_LEADER = "not leader"  # a standby answered: keep training, call the leader it names (or the next address)
    REGISTER_AGAIN = "register again"  # it no longer knows this incarnation (forgotten, replaced, token unknown)
    FATAL = "fatal"  # a bug on one side or the other: let it surface


# UNKNOWN and INTERNAL: the controller failed on this call (a bug or a bad moment), not a verdict on the
# node; RESOURCE_EXHAUSTED and ABORTED: try again later. None of them may stop an agent.
RETRYABLE_CODES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "RESOURCE_EXHAUSTED", "ABORTED"}
)


def classify_failure(code: str, reason: str) -> Failure:
    """``code``: the gRPC status code's name (``UNAVAILABLE``); ``reason``: the word the controller gave in
    its trailing metadata (:mod:`protos.reasons`; '' for none). A FAILED_PRECONDITION without
    ``register-again`` (a report of a generation never issued, say) is not a reason to register again, and a
    standby's ``not-leader`` never is, whatever its code: the node token is good at every controller."""
    if reason == NOT_LEADER:
        return Failure.NOT_LEADER
    if code in RETRYABLE_CODES:
        return Failure.RETRY
    if code in ("UNAUTHENTICATED", "NOT_FOUND") or reason == REGISTER_AGAIN:
        return Failure.REGISTER_AGAIN
    return Failure.FATAL


@dataclass(frozen=True)
class EpochFence:
    """The newest leader epoch this agent has seen, for its life, and the older ones it refused (each said once)."""

    newest: int = 0
    refused: frozenset[int] = frozenset()


@dataclass(frozen=True)
class EpochVerdict:
    act: bool  # the reply may be acted on
    say: bool  # refused, and its epoch was not refused before: log it (once per epoch)


def admit_epoch(fence: EpochFence, epoch: int) -> tuple[EpochVerdict, EpochFence]:
    """Whether a Register or Heartbeat reply carrying ``epoch`` may be acted on, and the fence after it. A reply
    older than the newest epoch seen comes from a deposed leader that does not know it yet: acting on its
    assignment could start a generation the new leader never issued. Epoch 0 (a controller without leases) is
    accepted only while no reply has carried one."""
    if epoch >= fence.newest:
        return EpochVerdict(act=True, say=False), replace(fence, newest=epoch)
    said = epoch in fence.refused
    return EpochVerdict(act=False, say=not said), replace(fence, refused=fence.refused | {epoch})


def next_register_backoff(backoff: float, cap: float) -> float:
    """The wait before the next registration attempt: doubling, up to ``cap``."""
    return min(backoff * 2, cap)


def backed_off_interval(interval: float, max_backoff: float, expiry: float) -> float:
    """The heartbeat interval after a failed beat: doubling, but never so long that a restarted controller
    finds this node silent for longer than its expiry (a third of it) and declares it LOST."""
    return min(interval * 2, min(max_backoff, expiry / 3))


LEASE_EXPIRIES = 6.0  # the default lease, in heartbeat expiries


def lease_seconds(configured: float | None, expiry: float) -> float:
    """How long the trainers' lease holds after the controller last answered (``LEASE_EXPIRIES`` heartbeat
    expiries unless set). It bounds how long a node cut off from the controller keeps training; it is not
    what keeps the job safe (the checkpoint directory's fence is), so it is long enough that a controller
    restart, during which every node is cut off alike, does not stop training."""
    return configured if configured is not None else LEASE_EXPIRIES * expiry


def lease_lapsed(last_contact: float, now: float, lease: float) -> bool:
    """The controller has not answered for longer than the lease: this node's trainers must stop."""
    return now - last_contact > lease


def beat_interval(interval: float, desired: Assignment | None, healthy: bool, morph_beat: float) -> float:
    """How long to wait for the next beat. While a morph is under way (this node's trainers are asked to
    stop or abort) the agent beats often, because the next generation's assignment only reaches it in a
    heartbeat reply; not while the controller is unreachable, where the backed-off interval holds."""
    if healthy and desired is not None and desired.action in ("stop", "abort", "hold"):
        return min(interval, morph_beat)
    return interval


HEARTBEAT_WAIT_SECONDS = 1.0  # below the call timeout; an eviction notice is pushed on its own meanwhile


def heartbeat_wait(running: bool) -> float:
    """How long the controller may hold a heartbeat's reply: only while none of this node's trainers runs,
    since a running one's exit or failed collective must reach the controller at once (pushed before a beat);
    the controller holds it only while work may reach the node within seconds."""
    return 0.0 if running else HEARTBEAT_WAIT_SECONDS


@dataclass(frozen=True)
class TrainerExited:
    report: TrainerReport


@dataclass(frozen=True)
class CheckpointCommitted:
    job_id: str
    generation: int
    step: int


@dataclass(frozen=True)
class PeerLost:
    """A trainer's collective failed: it holds its last completed step (``report.held``)."""

    report: TrainerReport


UrgentFact = TrainerExited | CheckpointCommitted | PeerLost


@dataclass(frozen=True)
class Pushed:
    """The urgent facts already pushed: each is pushed once (a lost push is carried by the next beat)."""

    exits: frozenset[TrainerKey] = frozenset()
    checkpoints: Mapping[tuple[str, int], int] = field(default_factory=dict)
    held: frozenset[TrainerKey] = frozenset()


def urgent_facts(reports: Iterable[TrainerReport], pushed: Pushed) -> tuple[list[UrgentFact], Pushed]:
    """Failed collectives, trainer exits and newly committed checkpoints not pushed yet, in report order.

    A checkpoint is committed by rank 0 (periodic, planned) or by the first writer of a salvage, which may
    be any rank; only a committing rank ever reports a committed step."""
    facts: list[UrgentFact] = []
    exits, checkpoints, held = set(pushed.exits), dict(pushed.checkpoints), set(pushed.held)
    for report in reports:
        key = report.status.key
        if report.held is not None and key not in held:
            held.add(key)
            facts.append(PeerLost(report))
        if not report.status.running and key not in exits:
            exits.add(key)
            facts.append(TrainerExited(report))
        step = report.last_checkpoint_step
        generation = (key.job_id, key.generation)
        if step is not None and step > checkpoints.get(generation, -1):
            checkpoints[generation] = step
            facts.append(CheckpointCommitted(key.job_id, key.generation, step))
    return facts, Pushed(frozenset(exits), checkpoints, frozenset(held))


@dataclass(frozen=True)
class EvictionNotice:
    event_id: str
    not_before: float  # unix seconds
    acknowledged: bool = False
    source: str = "azure-scheduled-events"  # what announced it (worker_agent.notices), as the controller is told


@dataclass(frozen=True)
class EvictionRisk:
    """The cloud's early warning that this VM is at elevated risk of eviction (AWS's rebalance recommendation),
    carried by every heartbeat until withdrawn."""

    source: str
    noticed_at: float  # unix seconds when the agent first saw it


def notice_deadline(not_before: float | None, now: float) -> float:
    """When the platform evicts (unix seconds); a notice without a time means now."""
    return not_before if not_before is not None else now


def may_acknowledge(
    notice: EvictionNotice | None,
    reports: Iterable[TrainerReport],
    desired: Assignment | None,
    untold: bool = False,
) -> bool:
    """Tell the platform it may evict now: nothing runs here and what ran stopped cleanly (its checkpoint
    is written), so waiting for ``NotBefore`` would only waste the notice. ``untold``: the trainers stopped on
    their own (:func:`stop_alone`) and no controller has heard yet; the VM stays until one does or the platform
    takes it, so the heartbeat that tells a returning leader is not lost with it."""
    if notice is None or notice.acknowledged or untold:
        return False
    reports = list(reports)
    if any(r.status.running for r in reports):
        return False
    failed = any(r.status.exit_code not in (None, 0) for r in reports)
    return not (failed and desired is not None)


# A standby that takes over is found within a beat or two; a Spot eviction notice gives 30 s or more.
ALONE_AFTER_SECONDS = 3.0


@dataclass(frozen=True)
class StoppedAlone:
    """A generation this node's agent asked to stop on its own at an eviction notice no controller had heard of."""

    event_id: str
    job_id: str
    generation: int


def alone_due(notice: EvictionNotice | None, heard: bool, waited: float, after: float) -> bool:
    """An eviction notice has been pending ``after`` seconds (``waited``) and no controller has heard of it (none
    answers, or none leads): the agent acts as the controller would at once, before the notice passes unused."""
    return notice is not None and not heard and waited >= after


def stop_alone(
    notice: EvictionNotice, desired: Assignment | None, trainers: Iterable[TrainerStatus]
) -> StoppedAlone | None:
    """The generation this node's trainers stop, leaving, once :func:`alone_due`: the one the controller told it
    to run, while a trainer of it runs and was not asked to stop. Leaving, they hand what only they hold to the
    ranks that stay (which keep the step in memory), or write the step when no rank stays or one cannot hold.
    Never a generation the controller holds, aborts or stops itself (its own order stands); never more than a stop."""
    if desired is None or desired.action != "run":
        return None
    current = (desired.job_id, desired.generation)
    if not any(t.running and not t.stop_requested and (t.key.job_id, t.key.generation) == current for t in trainers):
        return None
    return StoppedAlone(notice.event_id, desired.job_id, desired.generation)


def drained(notice: EvictionNotice | None, heard: bool, untold: bool, running: bool, now: float, until: float) -> bool:
    """A guest being shut down (a SIGTERM taken as a notice, ``--cloud gcp``) may let the agent exit: a controller
    heard of the notice and, in a heartbeat it answered, that none of this node's trainers runs (``running``: so it
    plans without this node, and knows how they stopped), or ``until`` (unix seconds: when the platform takes the VM
    anyway) has come."""
    if now >= until:
        return True
    return notice is not None and heard and not untold and not running
