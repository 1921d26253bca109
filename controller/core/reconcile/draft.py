"""The change set of one reconcile pass: the world as decided so far, and the commands that got it there.

Steps run one after another on one draft, so a later step sees what an earlier one decided (a node
found LOST makes its job morph in the same pass). Every change is a command, so the runner persists
exactly what was decided; states change only through :func:`controller.core.changes.move`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Unpack

from controller.core.causes import MorphCause
from controller.core.changes import act, amend, move
from controller.core.commands import Command, SetJob, SetNode
from controller.core.lifecycle import Action, JobState, NodeState
from controller.core.model import JobRecord, NodeRecord, World
from controller.core.records import JobFields, MoveFields, NodeFields
from controller.eventlog.fact import Fact

N = NodeState
SERVING = frozenset({N.ASSIGNED, N.DRAINING})


def free_nodes(nodes: Mapping[str, NodeRecord]) -> list[NodeRecord]:
    """Nodes no job holds and any job may be given, oldest first (ties by name): READY, and not suspected by a
    job's salvage since they were last heard from."""
    free = (n for n in nodes.values() if n.state is N.READY and n.job is None and n.suspected_at is None)
    return sorted(free, key=lambda n: (n.joined_at, n.name))


class Draft:
    """Nodes and jobs as decided so far in this pass, and the commands that decided them, in order."""

    def __init__(self, world: World, now: float) -> None:
        self.nodes = dict(world.nodes)
        self.jobs = dict(world.jobs)
        self.observed = world.observed
        self.pools = dict(world.pools)  # each pool's history (reconcile.on_demand observes it)
        self.started_at = world.started_at
        self.now = now
        self.commands: list[Command] = []
        self.unplannable: dict[str, str] = {}  # job -> why its planner failed (the job fails at the end of the pass)
        self.claimed: set[str] = set()  # free nodes a job that began a morph in this pass counts on

    def move_node(self, name: str, target: NodeState, reason: str, **fields: Unpack[NodeFields]) -> None:
        self._node(move(self.nodes[name], target, reason, self.now, **fields))

    def amend_node(self, name: str, **fields: Unpack[NodeFields]) -> None:
        self._node(amend(self.nodes[name], **fields))

    def move_job(self, job_id: str, target: JobState, reason: str, **fields: Unpack[MoveFields]) -> None:
        self._job(move(self.jobs[job_id], target, reason, self.now, **fields))

    def amend_job(self, job_id: str, **fields: Unpack[JobFields]) -> None:
        self._job(amend(self.jobs[job_id], **fields))

    def start_morph(
        self, job_id: str, action: Action, cause: MorphCause, detail: str, **fields: Unpack[JobFields]
    ) -> None:
        """The running job morphs: its trainers told ``action``, for ``cause``."""
        morph = fields.get("morph", replace(self.jobs[job_id].morph, keep_only=None))
        fields["morph"] = replace(morph, cause=cause, detail=detail)
        self.move_job(job_id, JobState.MORPHING, detail, action=action, **fields)

    def act(self, job_id: str, action: Action, reason: str, **fields: Unpack[JobFields]) -> None:
        """The morphing job's trainers told ``action`` instead (``reason`` goes in the event and ``morph.detail``)."""
        job = self.jobs[job_id]
        morph = fields.get("morph", job.morph)
        fields["morph"] = replace(morph, detail=f"{morph.detail}; {reason}")
        self._job(act(job, action, reason, self.now, **fields))

    def issue(self, command: Command) -> None:
        """A command that changes no record here (a checkpoint, a generation, a provider call)."""
        self.commands.append(command)

    def event(self, fact: Fact, job: str | None = None, node: str | None = None) -> None:
        """A fact for the event log, now, of ``job`` and ``node``."""
        self.commands.append(fact.recorded(self.now, job, node))

    def release_nodes(self, job_id: str, names: Sequence[str], reason: str = "job released it") -> None:
        """Nodes of ``names`` that ``job_id`` holds hold nothing from now on (assigned ones are READY)."""
        for name in names:
            node = self.nodes.get(name)
            if node is None or node.job != job_id:
                continue
            if node.state is N.ASSIGNED:
                self.move_node(name, N.READY, reason)
            else:
                self.amend_node(name, job=None)

    def assigned(self, job: JobRecord, name: str) -> bool:
        """The node runs this job and nothing threatens it."""
        node = self.nodes.get(name)
        return node is not None and node.state is N.ASSIGNED and node.job == job.id

    def serves(self, job: JobRecord, name: str) -> bool:
        """The node still serves this job: held by it and alive (maybe draining)."""
        node = self.nodes.get(name)
        return node is not None and node.job == job.id and node.state in SERVING

    def arrivals_settled(self, debounce_seconds: float) -> bool:
        """No free node joined within the debounce window (so a burst of arrivals is planned for at once)."""
        newest = max((n.joined_at for n in free_nodes(self.nodes)), default=-1e300)
        return self.now - newest >= debounce_seconds

    def _node(self, command: SetNode) -> None:
        self.nodes[command.node.name] = command.node
        self.commands.append(command)

    def _job(self, command: SetJob) -> None:
        self.jobs[command.job.id] = command.job
        self.commands.append(command)
