"""What must hold of every world reconcile leaves behind, whatever happened: checked, not assumed.

:func:`violations` lists what is wrong with a world (and, given the world before, with the step between
them), each naming its :class:`Invariant`; :func:`check` raises :class:`InvariantViolated` naming all of it.
The simulation tests run it after every step, and the runner before every commit when the controller runs
with ``--validate`` (every local cluster does; a decision that would break one is then contained like any
failing decision: not committed, and logged as ``InvariantViolated``).

Only what holds in *every* reachable world is here. Two things that look invariant are not: a QUEUED job
keeps the layout of its last generation (its nodes were released and may run another job now), and a
MORPHING job's layout may name a node that went GONE and came back as a new incarnation with other slots or
another job; so slots are claimed only by RUNNING jobs and by MORPHING ones on the nodes still holding them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from controller.core.causes import MorphCause
from controller.core.lifecycle import JOB_ACTIVE, JOB_STATE_ACTIONS, JOB_TERMINAL, Action, JobState, NodeState
from controller.core.model import World
from controller.core.records import JobRecord, Salvage

N = NodeState
HOLDING = frozenset({N.ASSIGNED, N.DRAINING, N.LOST})  # the node states that keep a job
SERVING = frozenset({N.ASSIGNED, N.DRAINING})  # a RUNNING job's nodes: one found LOST makes it morph in that pass
# A salvage's writers are ordered while HOLD; the ABORT that ends it (committed, or given up) keeps them unread.
WRITERS_KEPT = frozenset({Action.HOLD, Action.ABORT})


class Invariant(StrEnum):
    """The invariants, by the name a violation gives."""

    STATE_ACTION = "state-action"  # the job's (state, action) is a pair of lifecycle.JOB_STATE_ACTIONS
    ACTIVE_LAYOUT = "active-layout"  # a RUNNING or MORPHING job has a layout
    RUNNING_PLACEMENT = "running-placement"  # a RUNNING job's nodes exist, hold it, and are ASSIGNED or DRAINING
    SLOT_RANGE = "slot-range"  # a rank's slot index is below the slot count of the node holding its job
    ONE_RANK_PER_SLOT = "one-rank-per-slot"  # no (node, slot) runs two ranks, of one job or of two
    NODE_HOLDS = "node-holds"  # only ASSIGNED, DRAINING, LOST nodes hold a job: an active one placing ranks there
    SALVAGE_FIELDS = "salvage-fields"  # a job's salvage record agrees with its action (records.Salvage)
    # a step held in memory is an earlier generation's: the previous one's, or the one before it when the previous
    # generation ended before it took that step (its processes hold it again)
    HELD_GENERATION = "held-generation"
    GENERATION_FORWARD = "generation-forward"  # a job's generation never goes back
    FINAL_STATE = "final-state"  # a job that ended stays ended
    GROWTH_AT_RISK = "growth-at-risk"  # growth places no rank on a node at risk of eviction it did not run on
    RISK_MOVED_ONCE = "risk-moved-once"  # a job moves off a node for one risk episode once


@dataclass(frozen=True)
class Violation:
    """One invariant broken, and how."""

    invariant: Invariant
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


class InvariantViolated(AssertionError):
    """A decided world breaks an invariant: a bug in a decision, never an outside input."""

    def __init__(self, found: Sequence[Violation]) -> None:
        super().__init__("; ".join(map(str, found)))
        self.found = tuple(found)


def violations(world: World, before: World | None = None) -> list[Violation]:
    """Every invariant ``world`` breaks (empty: all hold); with ``before``, the step from it too."""
    found = [v for job in world.jobs.values() for v in _job(job)]
    found += _placement(world)
    found += _nodes(world)
    if before is not None:
        found += _step(before, world)
    return found


def check(world: World, before: World | None = None) -> None:
    """Raise :class:`InvariantViolated` naming every invariant ``world`` breaks."""
    found = violations(world, before)
    if found:
        raise InvariantViolated(found)


def _job(job: JobRecord) -> Iterator[Violation]:
    """What one job record must agree with by itself: its action, layout, salvage and held step."""
    if (job.state, job.action) not in JOB_STATE_ACTIONS:
        yield Violation(Invariant.STATE_ACTION, f"job {job.id} is {job.state} but its trainers are told {job.action}")
    if job.state in JOB_ACTIVE and job.layout is None:
        yield Violation(Invariant.ACTIVE_LAYOUT, f"job {job.id} is {job.state} without a layout")
    yield from _salvage(job)
    held = job.held.generation
    if job.held.step and not 0 < held < job.generation:
        detail = f"job {job.id} at generation {job.generation} holds step {job.held.step} of generation {held}"
        yield Violation(Invariant.HELD_GENERATION, f"{detail}, not of an earlier generation")
    if not job.held.step and held:
        yield Violation(Invariant.HELD_GENERATION, f"job {job.id} holds no step but names generation {held}")


def _salvage(job: JobRecord) -> Iterator[Violation]:
    """The salvage record (controller.core.reconcile.salvage) against the job's state and action."""
    salvage, name = job.salvage, f"job {job.id}"
    if job.state is JobState.RUNNING and salvage != Salvage():
        yield Violation(Invariant.SALVAGE_FIELDS, f"{name} is RUNNING with a salvage left ({salvage})")
    if bool(salvage.writers) != (salvage.deadline > 0):
        yield Violation(Invariant.SALVAGE_FIELDS, f"{name}'s salvage writers {salvage.writers} and deadline disagree")
    if salvage.writers and job.action not in WRITERS_KEPT:
        detail = f"{name} names salvage writers {salvage.writers} while told {job.action}"
        yield Violation(Invariant.SALVAGE_FIELDS, detail)
    if job.action is not Action.HOLD or job.layout is None:
        return
    if bool(salvage.step) != bool(salvage.writers):
        chosen = f"salvage step {salvage.step} and writers {salvage.writers}"
        yield Violation(Invariant.SALVAGE_FIELDS, f"{name} holds with {chosen}: one is chosen with the other")
    layout = job.layout
    stages = [layout.coords(w)[1] if 0 <= w < layout.world_size else -1 for w in salvage.writers]
    if salvage.writers and stages != list(range(layout.pipeline_stages)):
        detail = f"{name}'s salvage writers {salvage.writers} are not one rank of each stage in stage order"
        yield Violation(Invariant.SALVAGE_FIELDS, detail)


def _placement(world: World) -> Iterator[Violation]:
    """Ranks of active jobs against the nodes they are placed on: held, within the slots, one rank a slot."""
    claimed: dict[tuple[str, int], tuple[str, int]] = {}
    for job in sorted(world.jobs.values(), key=lambda j: j.id):
        if job.state not in JOB_ACTIVE or job.layout is None:
            continue
        running = job.state is JobState.RUNNING
        if running:
            yield from _running_nodes(world, job)
        for rank, slot in enumerate(job.layout.placement):
            node = world.nodes.get(slot.node)
            holds = node is not None and node.job == job.id
            if not (holds or running):
                continue  # a MORPHING job's rank on a node gone since: it claims nothing
            if node is not None and holds and not 0 <= slot.slot < node.slots:
                detail = f"rank {rank} of job {job.id} is on slot {slot.slot} of {node.name}, which has {node.slots}"
                yield Violation(Invariant.SLOT_RANGE, detail)
            other = claimed.setdefault((slot.node, slot.slot), (job.id, rank))
            if other != (job.id, rank):
                detail = f"{slot.node} slot {slot.slot} runs rank {other[1]} of job {other[0]} and rank {rank} of job"
                yield Violation(Invariant.ONE_RANK_PER_SLOT, f"{detail} {job.id}")


def _running_nodes(world: World, job: JobRecord) -> Iterator[Violation]:
    for name in job.nodes:
        node = world.nodes.get(name)
        if node is None:
            yield Violation(Invariant.RUNNING_PLACEMENT, f"job {job.id} is RUNNING on {name}, which does not exist")
        elif node.job != job.id:
            yield Violation(Invariant.RUNNING_PLACEMENT, f"job {job.id} is RUNNING on {name}, which does not hold it")
        elif node.state not in SERVING:
            yield Violation(Invariant.RUNNING_PLACEMENT, f"job {job.id} is RUNNING on {name}, which is {node.state}")


def _nodes(world: World) -> Iterator[Violation]:
    """A node holds a job only while it may run it, and only a job that places ranks on it."""
    for node in world.nodes.values():
        if node.job is None:
            if node.state is N.ASSIGNED:
                yield Violation(Invariant.NODE_HOLDS, f"node {node.name} is ASSIGNED but holds no job")
            continue
        held = world.jobs.get(node.job)
        if node.state not in HOLDING:
            yield Violation(Invariant.NODE_HOLDS, f"node {node.name} is {node.state} but holds job {node.job}")
        elif held is None:
            yield Violation(Invariant.NODE_HOLDS, f"node {node.name} holds job {node.job}, which does not exist")
        elif held.state not in JOB_ACTIVE:
            yield Violation(Invariant.NODE_HOLDS, f"node {node.name} still holds job {held.id}, which is {held.state}")
        elif node.name not in held.nodes:
            detail = f"node {node.name} holds job {held.id}, whose generation {held.generation} places no rank on it"
            yield Violation(Invariant.NODE_HOLDS, detail)


def _step(before: World, world: World) -> Iterator[Violation]:
    """What one decision may not do: take a job's generation back, bring it back from its end, grow it onto a node
    at risk of eviction, or move a job off one risk twice."""
    for job in world.jobs.values():
        was = before.jobs.get(job.id)
        if was is None:
            continue
        if job.generation < was.generation:
            detail = f"job {job.id}'s generation went back from {was.generation} to {job.generation}"
            yield Violation(Invariant.GENERATION_FORWARD, detail)
        if was.state in JOB_TERMINAL and job.state is not was.state:
            yield Violation(Invariant.FINAL_STATE, f"job {job.id} left {was.state} for {job.state}")
        grown = was.state is JobState.MORPHING and job.morph.cause is MorphCause.GROW  # not a queued job admitted
        if grown and job.generation > was.generation:
            taken = [n for n in job.nodes if n not in was.nodes and _at_risk(world, n)]
            if taken:
                detail = f"job {job.id}'s generation {job.generation} grew onto {', '.join(taken)}, at risk of eviction"
                yield Violation(Invariant.GROWTH_AT_RISK, detail)
    for node in world.nodes.values():
        old = before.nodes.get(node.name)
        moved = old.at_risk.moved_at if old is not None and old.at_risk is not None else None
        if moved is not None and node.at_risk is not None and node.at_risk.moved_at != moved:
            detail = f"a job was moved off {node.name} again for the eviction risk it first moved off at {moved}"
            yield Violation(Invariant.RISK_MOVED_ONCE, detail)


def _at_risk(world: World, name: str) -> bool:
    node = world.nodes.get(name)
    return node is not None and node.at_risk is not None
