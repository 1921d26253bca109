"""What must hold of every world reconcile leaves behind, whatever happened: checked, not assumed.

:func:`violations` lists what is wrong with a world (and, given the world before, with the step between
them); :func:`check` raises :class:`InvariantViolated` naming all of it. The simulation tests run it after
every step, and the runner before every commit when the controller runs with ``--validate`` (a decision
that would break one is then contained like any failing decision: not committed).
"""

from __future__ import annotations

from controller.core.lifecycle import JOB_ACTIVE, JOB_TERMINAL, Action, JobState, NodeState
from controller.core.model import World

HOLDING = frozenset({NodeState.ASSIGNED, NodeState.DRAINING, NodeState.LOST})  # the node states that keep a job


class InvariantViolated(AssertionError):
    """A decided world breaks an invariant: a bug in a decision, never an outside input."""


def violations(world: World, before: World | None = None) -> list[str]:
    """Every invariant ``world`` breaks, one sentence each (empty: all hold)."""
    found: list[str] = []
    for job in world.jobs.values():
        if job.state in JOB_ACTIVE and job.layout is None:
            found.append(f"job {job.id} is {job.state} without a layout")
        if job.state is JobState.RUNNING and job.action is not Action.RUN:
            found.append(f"job {job.id} is RUNNING but its trainers are told {job.action}")
        if job.state is JobState.RUNNING:
            found += [
                f"job {job.id} is RUNNING on {name}, which does not hold it"
                for name in job.nodes
                if name in world.nodes and world.nodes[name].job != job.id
            ]
    for node in world.nodes.values():
        if node.job is None:
            continue
        held = world.jobs.get(node.job)
        if node.state not in HOLDING:
            found.append(f"node {node.name} is {node.state} but holds job {node.job}")
        elif held is None:
            found.append(f"node {node.name} holds job {node.job}, which does not exist")
        elif held.state in JOB_TERMINAL:
            found.append(f"node {node.name} still holds job {held.id}, which is {held.state}")
    if before is not None:
        for job in world.jobs.values():
            was = before.jobs.get(job.id)
            if was is not None and job.generation < was.generation:
                found.append(f"job {job.id}'s generation went back from {was.generation} to {job.generation}")
            if was is not None and was.state in JOB_TERMINAL and job.state is not was.state:
                found.append(f"job {job.id} left {was.state} for {job.state}")
    return found


def check(world: World, before: World | None = None) -> None:
    """Raise :class:`InvariantViolated` naming every invariant ``world`` breaks."""
    found = violations(world, before)
    if found:
        raise InvariantViolated("; ".join(found))
