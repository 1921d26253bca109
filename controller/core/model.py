"""The world reconcile decides on, and how commands change it.

Records (nodes, jobs: :mod:`controller.core.records`) live in the store; observations
(:mod:`controller.core.observations`) are what agents report with every heartbeat; commands
(:mod:`controller.core.commands`) are what :mod:`controller.core.reconcile` returns and
:mod:`controller.shell.runner` persists, then performs. Their names are re-exported here, so callers
import the whole vocabulary from one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import assert_never

from controller.core.commands import (
    AddJob,
    Command,
    ForgetNode,
    RecordCheckpoint,
    RecordPause,
    ReleaseInstance,
    RequestCapacity,
    SetJob,
    SetNode,
    SetNodeSeq,
    SetPoolStats,
    StartGeneration,
)
from controller.core.observations import NodeObservation, RankReport
from controller.core.records import (
    Action,
    Assignment,
    CheckpointRef,
    Gpu,
    JobRecord,
    NodeRecord,
    SalvageOrder,
    Training,
    ranks_by_node,
)
from controller.eventlog.fact import RecordEvent
from scheduler.forecast import PoolStats
from scheduler.pools import PoolKind

__all__ = [
    "Action",
    "AddJob",
    "Assignment",
    "CheckpointRef",
    "Command",
    "ForgetNode",
    "Gpu",
    "JobRecord",
    "NodeObservation",
    "NodeRecord",
    "RankReport",
    "RecordCheckpoint",
    "RecordEvent",
    "RecordPause",
    "ReleaseInstance",
    "RequestCapacity",
    "SalvageOrder",
    "SetJob",
    "SetNode",
    "SetNodeSeq",
    "SetPoolStats",
    "StartGeneration",
    "Training",
    "World",
    "apply",
    "ranks_by_node",
]


@dataclass(frozen=True)
class World:
    """Everything decisions may look at: stored records, observations, when this controller started, counters."""

    nodes: Mapping[str, NodeRecord]
    jobs: Mapping[str, JobRecord]
    observed: Mapping[str, NodeObservation] = field(default_factory=dict)
    started_at: float = 0.0
    job_seq: int = 0  # jobs submitted so far (the next is job-<job_seq + 1>)
    node_seq: int = 0  # node names generated so far
    incarnation_floor: int = 0  # the highest incarnation of a forgotten node: new names start above it
    pools: Mapping[PoolKind, PoolStats] = field(default_factory=dict)  # each pool's history, as the forecast counts


def apply(world: World, commands: list[Command]) -> World:
    """The world after ``commands``: what the store holds once the runner persisted them."""
    nodes = dict(world.nodes)
    jobs = dict(world.jobs)
    job_seq, node_seq, floor = world.job_seq, world.node_seq, world.incarnation_floor
    forgotten: set[str] = set()
    pools = dict(world.pools)
    for command in commands:
        if isinstance(command, SetNode):
            nodes[command.node.name] = command.node
        elif isinstance(command, SetJob):
            jobs[command.job.id] = command.job
        elif isinstance(command, AddJob):
            jobs[command.job.id] = command.job
            job_seq = max(job_seq, command.seq)
        elif isinstance(command, SetNodeSeq):
            node_seq = command.seq
        elif isinstance(command, SetPoolStats):
            pools[command.stats.kind] = command.stats
        elif isinstance(command, ForgetNode):
            nodes.pop(command.node, None)
            forgotten.add(command.node)
            floor = max(floor, command.incarnation)
        elif isinstance(
            command, StartGeneration | RecordCheckpoint | RecordPause | RecordEvent | ReleaseInstance | RequestCapacity
        ):
            pass  # history and side effects: the store keeps them, the world's records do not change
        else:
            assert_never(command)  # a new command type must say here what it changes
    observed = {k: v for k, v in world.observed.items() if k not in forgotten} if forgotten else world.observed
    return World(nodes, jobs, observed, world.started_at, job_seq, node_seq, floor, pools)
