"""Pure decisions on input from outside the reconcile loop: submissions, registrations, commits, provider lists.

Like :mod:`controller.core.reconcile`, these take the world and ``now`` and return commands. Refusals
are exceptions the server maps to a status: the fencing checks (incarnation, generation) raise
:class:`Stale`, a name or key bound to something else :class:`Taken`, a live node's name claimed by
another instance :class:`NotOwner`, a resource another job holds :class:`Conflict`, a limit reached
:class:`Full`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import asdict

from controller.core.changes import amend, move
from controller.core.flapping import Damping, rejoin
from controller.core.lifecycle import JOB_ACTIVE, JOB_TERMINAL, JobState, NodeState
from controller.core.model import (
    AddJob,
    CheckpointRef,
    Command,
    Gpu,
    JobRecord,
    NodeObservation,
    NodeRecord,
    RecordCheckpoint,
    SetNode,
    SetNodeSeq,
    World,
)
from controller.eventlog import facts
from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from scheduler.pools import PoolKind

GONE_OR_LOST = frozenset({NodeState.GONE, NodeState.LOST})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class Stale(Exception):
    """A write fenced off: an old incarnation or generation. ``str()`` says which and what to do."""


class Taken(Exception):
    """A name or key already bound to something else (a live node's name, a key of another spec)."""


class NotOwner(Exception):
    """A live node's name claimed by an instance other than the one it is bound to: a takeover."""


class Conflict(Exception):
    """What a request needs is held by another job (its checkpoint directory)."""


class Full(Exception):
    """The controller already keeps as many of something as it may (live nodes, a node's trainers)."""


MAX_LIVE_NODES = 10_000  # nodes not GONE; beyond it registrations are refused (JOINING floods included)


def submit(world: World, spec: JobSpec, key: str | None, now: float) -> tuple[JobRecord, list[Command]]:
    """A new queued job; the job ``key`` already made when a retry brings it again (no commands)."""
    if key:
        first = next((j for j in world.jobs.values() if j.idempotency_key == key), None)
        if first is not None and first.spec != spec:
            raise Taken(f"idempotency_key {key!r} was used for {first.id} with another spec; use a new key")
        if first is not None:
            return first, []
    # Any job's, ended ones too: their checkpoints are there, and this job's pruning (keep) would delete them.
    holder = next((j for j in world.jobs.values() if _nested(j.spec.checkpoint_dir, spec.checkpoint_dir)), None)
    if holder is not None:
        held = "is in use by" if holder.state not in JOB_TERMINAL else "holds the checkpoints of"
        raise Conflict(
            f"checkpoint_dir {spec.checkpoint_dir}: {holder.spec.checkpoint_dir} {held} {holder.id} ({holder.state}); "
            "give this job its own "
            "directory (a job's checkpoints are resumed only by that job)"
        )
    deadline = spec.deadline_seconds()
    if deadline is not None and deadline <= now:
        raise UserInputError(
            f"deadline {spec.deadline}: passed {now - deadline:.0f} s ago on the controller's clock; "
            "set a time to come (ISO-8601 with a zone), or drop deadline"
        )
    seq = world.job_seq + 1
    job = JobRecord(f"job-{seq}", spec, JobState.QUEUED, now, now, idempotency_key=key or None, queued_since=now)
    return job, [AddJob(job, seq)]


def _nested(a: str, b: str) -> bool:
    """One directory is the other or inside it: one job's checkpoint pruning could delete the other's."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def next_node_name(world: World) -> tuple[str, int]:
    """``node-N`` for the next N of a counter no requested name moves (names asked for are skipped)."""
    seq = world.node_seq + 1
    while f"node-{seq}" in world.nodes:
        seq += 1
    return f"node-{seq}", seq


def instance_of(instance_id: str, address: str, certificate: str | None, *, proven: bool = True) -> str:
    """Who a registration comes from: its instance id (else its address), and its certificate.

    ``proven``: a per-VM agent token vouches for the instance id. What a shared token's holder merely
    claims is marked "unverified", so that no claim ever equals an instance a per-VM token proved.
    """
    who = f"instance {instance_id}" if instance_id else f"address {address}"
    who = who if proven else f"unverified {who}"
    return f"{who}, certificate {certificate}" if certificate else who


def _live_node_of(world: World, instance: str) -> NodeRecord | None:
    """The live node a VM proved by its per-VM token already is (a claim proves nothing, so binds no VM)."""
    if not instance.startswith("instance "):
        return None
    return next((n for n in world.nodes.values() if n.instance == instance and n.state not in GONE_OR_LOST), None)


def register(
    world: World,
    requested: str,
    slots: int,
    address: str,
    now: float,
    instance: str = "",
    gpus: tuple[Gpu, ...] = (),
    damping: Damping | None = None,
) -> tuple[NodeRecord, list[Command]]:
    """A new incarnation of a node (with the GPUs its agent found); an older incarnation is GONE from now on.

    A live name (not LOST or GONE) is taken over only by the instance it is bound to (an agent
    restarting on the same VM); anyone else is refused with :class:`NotOwner`, since a takeover would
    evict its job. A VM its per-VM token proves is one live node: another name is refused while that node
    lives, and no name at all is that node's. ``instance`` is :func:`instance_of` the request; "" binds the
    name to nothing. A name whose previous incarnation was LOST a short while ago waits in JOINING
    (:mod:`controller.core.flapping`).
    """
    commands: list[Command] = []
    name = requested
    held = _live_node_of(world, instance)
    if held is not None and name and name != held.name:
        raise NotOwner(
            f"{instance} is already node {held.name} ({held.state}, incarnation {held.incarnation}); one VM is "
            f"one node: register as {held.name} (or with no node_name), or wait until {held.name} is LOST"
        )
    if not name and held is not None:
        name = held.name  # the VM's agent came back without its name: its node, as a new incarnation
    if not name:
        name, seq = next_node_name(world)
        commands.append(SetNodeSeq(seq))
    if not _NAME.fullmatch(name):
        raise UserInputError(f"node_name {name[:80]!r}: use letters, digits, '.', '_' or '-' (at most 63)")
    old = world.nodes.get(name)
    if old is None or old.state is NodeState.GONE:
        live = sum(1 for n in world.nodes.values() if n.state is not NodeState.GONE)
        if live >= MAX_LIVE_NODES:
            raise Full(f"{live} nodes are registered and not gone, the most a controller keeps; release some first")
    incarnation = world.incarnation_floor + 1  # above every forgotten incarnation (controller.core.retention)
    back = rejoin(old, now, damping or Damping())
    if old is not None:
        if old.state not in GONE_OR_LOST and old.instance and old.instance != instance:
            raise NotOwner(
                f"node {name} is alive ({old.state}, incarnation {old.incarnation}) and belongs to "
                f"{old.instance}; {instance or 'this registration'} may not take it over: wait until it is LOST "
                "(its heartbeats stopped) or register under another node_name"
            )
        incarnation = old.incarnation + 1
        if old.state is not NodeState.GONE:
            commands.append(move(old, NodeState.GONE, "re-registered as a new incarnation", now))
    node = NodeRecord(
        name,
        incarnation,
        NodeState.JOINING,
        slots,
        address,
        joined_at=now,
        state_since=now,
        instance=instance,
        gpus=gpus,
        flaps=back.flaps,
        flapped_at=back.flapped_at,
        quarantined_until=back.quarantined_until,
        # The same VM's agent coming back keeps the time; another VM taking the name (or a new name) starts it.
        name_taken_at=old.name_taken_at if old is not None and old.instance == instance else now,
    )
    commands.append(SetNode(node))
    registered = facts.NodeRegistered(incarnation, slots, address, [asdict(g) for g in gpus])
    commands.append(registered.recorded(now, node=name))
    if back.quarantined_until is not None:
        seconds = back.quarantine_seconds(now)
        message = (
            f"back {now - (back.flapped_at or now):.1f} s after it was LOST (flap {back.flaps}): quarantined in "
            f"JOINING for {seconds:g} s before it gets work"
        )
        quarantine = facts.NodeQuarantined(back.flaps, back.flapped_at, seconds, back.quarantined_until, message)
        commands.append(quarantine.recorded(now, node=name))
    return node, commands


def check_incarnation(world: World, name: str, incarnation: int) -> NodeRecord:
    node = world.nodes.get(name)
    if node is None:
        raise LookupError(f"node {name} is not registered")
    if node.incarnation != incarnation or node.state in GONE_OR_LOST:
        # A LOST incarnation is over too: its job has moved on, so it kills its trainers and comes back anew.
        raise Stale(
            f"node {name} incarnation {incarnation} is stale (current {node.incarnation}, {node.state}); register again"
        )
    return node


def commit_checkpoint(world: World, job_id: str, generation: int, step: int, now: float) -> list[Command]:
    """A checkpoint the current generation committed; older or newer generations are fenced off."""
    job = world.jobs.get(job_id)
    if job is None:
        raise LookupError(f"job {job_id} not found")
    if job.state not in JOB_ACTIVE or generation != job.generation:
        raise Stale(f"job {job_id} is at generation {job.generation} ({job.state}); generation {generation} is stale")
    if step <= job.last_checkpoint.step:
        return []
    return [
        RecordCheckpoint(job_id, generation, step, now),
        facts.CheckpointCommitted(generation, step).recorded(now, job_id),
        amend(job, last_checkpoint=CheckpointRef(step, generation), step=max(step, job.step)),
    ]


def provider_gone(world: World, listed: Collection[str], now: float) -> list[Command]:
    """Nodes the provider no longer lists are GONE (their jobs morph on the next reconcile)."""
    commands: list[Command] = []
    for name, node in sorted(world.nodes.items()):
        if name in listed or node.state is NodeState.GONE:
            continue
        commands.append(move(node, NodeState.GONE, "the provider no longer lists it", now))
    return commands


def provider_listed(world: World, listed: Mapping[str, PoolKind], now: float) -> list[Command]:
    """The provider's list: nodes missing from it are GONE, and each listed node is in the pool it names (an
    on-demand node's owner is chosen by the next reconcile: :mod:`~controller.core.reconcile.on_demand`)."""
    commands = provider_gone(world, frozenset(listed), now)
    for name, pool in sorted(listed.items()):
        node = world.nodes.get(name)
        if node is not None and node.state is not NodeState.GONE and node.pool is not pool:
            commands.append(amend(node, pool=pool, owner=None))
    return commands


def request_checkpoints(world: World, now: float) -> list[Command]:
    """Ask every running job for a checkpoint at its next step boundary (a time-based safety net)."""
    commands: list[Command] = []
    for job in world.jobs.values():
        if job.state is JobState.RUNNING:
            commands.append(amend(job, checkpoint_request=job.checkpoint_request + 1))
    return commands


def essence(seen: NodeObservation | None) -> object:
    """What in an observation can change a decision (not the time, not the step): the runner decides at once
    on a change of it, and leaves the rest to the next tick. An eviction risk's coming or going is one (a node
    at risk gets no work; its job may move off it), not its words or times."""
    if seen is None:
        return None
    ranks = sorted(
        (
            r.job,
            r.generation,
            r.rank,
            r.running,
            r.exit_code is None,
            r.exit_code or 0,
            r.last_checkpoint_step,
            r.held_step or -1,
        )
        for r in seen.ranks
    )  # exit_code None and a number never compared: a node may report a rank twice
    return (seen.incarnation, seen.eviction_not_before, seen.building, seen.risk is not None, tuple(ranks))
