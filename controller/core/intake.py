"""Pure decisions on input from outside the reconcile loop: registrations, commits, provider lists.

Like :mod:`controller.core.reconcile`, these take the world and ``now`` and return commands; the fencing
checks (incarnation, generation) raise :class:`Stale` so the server can answer FAILED_PRECONDITION.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import asdict

from controller.core.changes import amend, move
from controller.core.events import EventKind
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import (
    Command,
    Gpu,
    NodeRecord,
    RecordCheckpoint,
    RecordEvent,
    SetNode,
    World,
)

ACTIVE = frozenset({JobState.RUNNING, JobState.MORPHING})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class Stale(Exception):
    """A write fenced off: an old incarnation or generation. ``str()`` says which and what to do."""


def next_node_name(world: World) -> str:
    """``node-N``: N is one more than the largest N used so far, so names follow join order."""
    numbers = [int(n[5:]) for n in world.nodes if n.startswith("node-") and n[5:].isdigit()]
    return f"node-{max(numbers, default=0) + 1}"


def register(
    world: World, requested: str, slots: int, address: str, now: float, gpus: tuple[Gpu, ...] = ()
) -> tuple[NodeRecord, list[Command]]:
    """A new incarnation of a node (with the GPUs its agent found); an older incarnation is GONE from now on."""
    name = requested or next_node_name(world)
    if not _NAME.match(name):
        raise ValueError(f"node_name {name!r}: use letters, digits, '.', '_' or '-' (at most 63)")
    commands: list[Command] = []
    old = world.nodes.get(name)
    incarnation = 1
    if old is not None:
        incarnation = old.incarnation + 1
        if old.state is not NodeState.GONE:
            commands.append(move(old, NodeState.GONE, "re-registered as a new incarnation", now))
    node = NodeRecord(name, incarnation, NodeState.JOINING, slots, address, joined_at=now, state_since=now, gpus=gpus)
    commands.append(SetNode(node))
    data = {"incarnation": incarnation, "slots": slots, "address": address, "gpus": [asdict(g) for g in gpus]}
    commands.append(RecordEvent(EventKind.NODE_REGISTERED, now, None, name, data))
    return node, commands


def check_incarnation(world: World, name: str, incarnation: int) -> NodeRecord:
    node = world.nodes.get(name)
    if node is None:
        raise LookupError(f"node {name} is not registered")
    if node.incarnation != incarnation or node.state is NodeState.GONE:
        raise Stale(
            f"node {name} incarnation {incarnation} is stale (current {node.incarnation}, {node.state}); register again"
        )
    return node


def commit_checkpoint(world: World, job_id: str, generation: int, step: int, now: float) -> list[Command]:
    """A checkpoint the current generation committed; older or newer generations are fenced off."""
    job = world.jobs.get(job_id)
    if job is None:
        raise LookupError(f"job {job_id} not found")
    if job.state not in ACTIVE or generation != job.generation:
        raise Stale(f"job {job_id} is at generation {job.generation} ({job.state}); generation {generation} is stale")
    if step <= job.last_checkpoint_step:
        return []
    return [
        RecordCheckpoint(job_id, generation, step, now),
        RecordEvent(EventKind.CHECKPOINT_COMMITTED, now, job_id, None, {"generation": generation, "step": step}),
        amend(job, last_checkpoint_step=step, step=max(step, job.step)),
    ]


def provider_gone(world: World, listed: Collection[str], now: float) -> list[Command]:
    """Nodes the provider no longer lists are GONE (their jobs morph on the next reconcile)."""
    commands: list[Command] = []
    for name, node in sorted(world.nodes.items()):
        if name in listed or node.state is NodeState.GONE:
            continue
        commands.append(move(node, NodeState.GONE, "the provider no longer lists it", now))
    return commands


def request_checkpoints(world: World, now: float) -> list[Command]:
    """Ask every running job for a checkpoint at its next step boundary (a time-based safety net)."""
    commands: list[Command] = []
    for job in world.jobs.values():
        if job.state is JobState.RUNNING:
            commands.append(amend(job, checkpoint_request=job.checkpoint_request + 1))
    return commands
