"""Reconcile: a pure function from (world, now) to commands.

No I/O and no clock: the caller passes ``now`` and a planner per job. The steps run in a fixed order
on a draft copy of the world, so later steps see earlier decisions (a node found LOST makes its job
morph in the same pass). The morph protocol, with generations as fencing tokens:

- planned (eviction notice, growth): action STOP for generation g; trainers agree on a step boundary,
  checkpoint and exit 0; then generation g+1 is planned on the nodes left and resumes from that
  checkpoint;
- unplanned (node lost, trainer failed): action ABORT for the survivors, then g+1 resumes from the
  newest committed checkpoint.

Generation g+1 is issued only when no rank of generation g still runs (or its node is gone), so two
generations never share a slot; reports of any other generation never change the job.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.core.changes import amend, move
from controller.core.lifecycle import JobState, NodeState
from controller.core.model import (
    Action,
    Assignment,
    Command,
    JobRecord,
    NodeObservation,
    NodeRecord,
    RecordCheckpoint,
    RecordEvent,
    ReleaseInstance,
    SetJob,
    SetNode,
    StartGeneration,
    World,
    ranks_by_node,
)
from morphing.planner import Plan, Planner
from morphing.policy import PolicyConfig, decide_morph
from scheduler.queue import QueueEntry, admit

N = NodeState
J = JobState
LIVE_NODE = frozenset({N.READY, N.ASSIGNED})
ACTIVE_JOB = frozenset({J.RUNNING, J.MORPHING})


@dataclass(frozen=True)
class Config:
    heartbeat_expiry_seconds: float = 10.0
    lost_to_gone_seconds: float = 120.0
    debounce_seconds: float = 5.0
    stop_timeout_seconds: float = 120.0  # a STOP not done by then becomes ABORT
    abort_timeout_seconds: float = 30.0  # survivors that never confirm are given up on
    morph_cost_seconds: float = 30.0
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rendezvous_port_base: int = 29500
    rendezvous_port_span: int = 500


Planners = Mapping[str, Planner | str]  # job id -> planner, or why none could be built


def reconcile(world: World, now: float, config: Config, planners: Planners) -> list[Command]:
    draft = _Draft(world, now, config, planners)
    draft.node_health()
    for job_id in sorted(draft.jobs):
        if draft.jobs[job_id].state in ACTIVE_JOB:
            draft.progress(job_id)
    for job_id in sorted(draft.jobs):
        job = draft.jobs[job_id]
        if job.state is J.RUNNING:
            draft.check_running(job_id)
        if draft.jobs[job_id].state is J.MORPHING:
            draft.advance_morph(job_id)
    draft.admit_queued()
    draft.grow()
    return draft.commands


def assignment_for(
    world: World, node_name: str, ranks_of: Mapping[str, tuple[int, ...]] | None = None
) -> Assignment | None:
    """The assignment a node's heartbeat gets back; ``None``: run nothing.

    ``ranks_of``: ``ranks_by_node`` of the node's job's layout when the caller keeps it (it is the same
    for every heartbeat of a generation); computed here otherwise.
    """
    node = world.nodes.get(node_name)
    if node is None or node.job is None or node.state is N.GONE:
        return None
    job = world.jobs.get(node.job)
    if job is None or job.layout is None or job.state not in ACTIVE_JOB:
        return None
    if ranks_of is None:
        ranks_of = ranks_by_node(job.layout)
    ranks = ranks_of.get(node_name, ())
    if not ranks:
        return None
    return Assignment(
        job=job.id,
        generation=job.generation,
        ranks=ranks,
        slots=tuple(job.layout.placement[r].slot for r in ranks),
        layout=job.layout,
        rendezvous=job.rendezvous,
        checkpoint_dir=job.spec.checkpoint_dir,
        resume_step=job.resume_step,
        action=job.action,
        entrypoint=job.spec.entrypoint,
        spec=job.spec,
        checkpoint_request=job.checkpoint_request,
    )


def cancel(world: World, job_id: str, now: float, who: str) -> list[Command]:
    """Commands that cancel a job and free its nodes (its agents then stop their trainers)."""
    draft = _Draft(world, now, Config(), {})
    job = draft.jobs[job_id]
    draft.move_job(job_id, J.CANCELLED, f"cancelled by {who}")
    draft.release_nodes(job.id, job.nodes)
    return draft.commands


def free_nodes(nodes: Mapping[str, NodeRecord]) -> list[NodeRecord]:
    return sorted(
        (n for n in nodes.values() if n.state is N.READY and n.job is None), key=lambda n: (n.joined_at, n.name)
    )


class _Draft:
    def __init__(self, world: World, now: float, config: Config, planners: Planners) -> None:
        self.nodes = dict(world.nodes)
        self.jobs = dict(world.jobs)
        self.observed = world.observed
        self.started_at = world.started_at
        self.now = now
        self.config = config
        self.planners = planners
        self.commands: list[Command] = []

    # -- changes: every change is a command, so the runner persists exactly what was decided

    def move_node(self, name: str, target: NodeState, reason: str, **fields: object) -> None:
        self._node(move(self.nodes[name], target, reason, self.now, **fields))

    def amend_node(self, name: str, **fields: object) -> None:
        self._node(amend(self.nodes[name], **fields))

    def move_job(self, job_id: str, target: JobState, reason: str, **fields: object) -> None:
        self._job(move(self.jobs[job_id], target, reason, self.now, **fields))

    def amend_job(self, job_id: str, **fields: object) -> None:
        self._job(amend(self.jobs[job_id], **fields))

    def _node(self, command: SetNode) -> None:
        self.nodes[command.node.name] = command.node
        self.commands.append(command)

    def _job(self, command: SetJob) -> None:
        self.jobs[command.job.id] = command.job
        self.commands.append(command)

    def event(self, kind: str, job: str | None = None, node: str | None = None, **data: object) -> None:
        self.commands.append(RecordEvent(kind, self.now, job, node, data))

    def release_nodes(self, job_id: str, names: Sequence[str], reason: str = "job released it") -> None:
        for name in names:
            node = self.nodes.get(name)
            if node is None or node.job != job_id:
                continue
            if node.state is N.ASSIGNED:
                self.move_node(name, N.READY, reason)
            else:
                self.amend_node(name, job=None)

    # -- nodes

    def _last_seen(self, node: NodeRecord) -> float:
        seen = self.observed.get(node.name)
        base = max(node.state_since, self.started_at)  # a restart gives every node a fresh window
        if seen is not None and seen.incarnation == node.incarnation:
            return max(base, seen.last_seen)
        return base

    def node_health(self) -> None:
        expiry = self.config.heartbeat_expiry_seconds
        for name in sorted(self.nodes):
            node = self.nodes[name]
            seen = self.observed.get(name)
            current = seen if seen is not None and seen.incarnation == node.incarnation else None
            silent = self.now - self._last_seen(node) > expiry
            if node.state is N.JOINING and current is not None and not silent:
                self.move_node(name, N.READY, "first heartbeat")
            node = self.nodes[name]
            if current is not None and current.eviction_not_before is not None and node.state in {N.READY, N.ASSIGNED}:
                self.event("EvictionNoticed", node.job, name, not_before=current.eviction_not_before)
                self.move_node(name, N.DRAINING, "eviction notice", eviction_not_before=current.eviction_not_before)
            node = self.nodes[name]
            if not silent:
                continue
            if node.state in LIVE_NODE:
                self.move_node(name, N.LOST, f"no heartbeat for {expiry:g} s")
            elif node.state in {N.JOINING, N.DRAINING}:
                self.move_node(name, N.GONE, "heartbeats stopped")
                self.commands.append(ReleaseInstance(name))
            elif node.state is N.LOST and self.now - node.state_since > self.config.lost_to_gone_seconds:
                self.move_node(name, N.GONE, f"lost for {self.config.lost_to_gone_seconds:g} s")
                self.commands.append(ReleaseInstance(name))

    def _healthy(self, job: JobRecord, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and node.state is N.ASSIGNED and node.job == job.id

    def _member(self, job: JobRecord, name: str) -> bool:
        """The node still serves this job: held by it and alive (maybe draining)."""
        node = self.nodes.get(name)
        return node is not None and node.job == job.id and node.state in {N.ASSIGNED, N.DRAINING}

    def _reports(self, job: JobRecord, name: str) -> NodeObservation | None:
        seen = self.observed.get(name)
        node = self.nodes.get(name)
        if seen is None or node is None or seen.incarnation != node.incarnation:
            return None
        return seen

    # -- jobs

    def progress(self, job_id: str) -> None:
        """Steps and checkpoints from reports of the current generation only (the fencing rule)."""
        job = self.jobs[job_id]
        step, ckpt = job.step, job.last_checkpoint_step
        for name in job.nodes:
            seen = self._reports(job, name)
            for r in seen.ranks if seen else ():
                if r.job == job.id and r.generation == job.generation:
                    step, ckpt = max(step, r.last_step), max(ckpt, r.last_checkpoint_step)
        if ckpt > job.last_checkpoint_step:
            self.commands.append(RecordCheckpoint(job.id, job.generation, ckpt, self.now))
            self.event("CheckpointCommitted", job.id, generation=job.generation, step=ckpt)
        if (step, ckpt) != (job.step, job.last_checkpoint_step):
            self.amend_job(job_id, step=step, last_checkpoint_step=ckpt)

    def _rank_states(self, job: JobRecord) -> tuple[int, int, int, bool]:
        """(ranks expected, ranks finished all steps, ranks failed, every node quiet)."""
        expected = job.layout.world_size if job.layout else 0
        done = failed = 0
        quiet = True
        for name in job.nodes:
            seen = self._reports(job, name)
            if not self._member(job, name):
                continue  # lost, gone, or a new incarnation: nothing of this job runs there
            if seen is None or (job.morph_started_at is not None and seen.last_seen < job.morph_started_at):
                quiet = False  # no report since the morph began: the agent may still be starting trainers
                continue
            for r in seen.ranks:
                if r.job != job.id or r.generation > job.generation:
                    continue
                if r.running:
                    quiet = False
                elif r.generation == job.generation:
                    if r.exit_code == 0 and r.last_step >= job.spec.steps:
                        done += 1
                    elif job.action is Action.RUN:
                        failed += 1
        return expected, done, failed, quiet

    def check_running(self, job_id: str) -> None:
        job = self.jobs[job_id]
        expected, done, failed, _ = self._rank_states(job)
        if expected and done == expected:
            self.move_job(job_id, J.SUCCEEDED, f"finished step {job.spec.steps}")
            self.release_nodes(job_id, job.nodes, "job succeeded")
            return
        lost = [n for n in job.nodes if not self._member(job, n)]
        draining = [n for n in job.nodes if self._member(job, n) and self.nodes[n].state is N.DRAINING]
        if lost:
            self.start_morph(job_id, Action.ABORT, f"node lost: {', '.join(lost)}")
        elif failed:
            unstarted = self._start_failures(job)
            if unstarted and len(unstarted) < len(job.nodes):
                for name, error in sorted(unstarted.items()):
                    self.event("TrainerStartFailed", job_id, name, generation=job.generation, error=error)
                names = ", ".join(sorted(unstarted))
                excluded = tuple(sorted({*job.excluded_nodes, *unstarted}))
                self.start_morph(
                    job_id,
                    Action.ABORT,
                    f"trainers could not start on {names}; re-planning without it",
                    excluded_nodes=excluded,
                )
                return
            why = next(iter(unstarted.values()), "") or self._first_error(job)
            if job.restarts + 1 > job.spec.max_restarts:
                reason = f"{failed} trainer(s) failed; max_restarts={job.spec.max_restarts}"
                self.move_job(job_id, J.FAILED, f"{reason}: {why}" if why else reason)
                self.release_nodes(job_id, job.nodes, "job failed")
                return
            self.start_morph(job_id, Action.ABORT, f"{failed} trainer(s) failed", restarts=job.restarts + 1)
        elif draining:
            self.start_morph(job_id, Action.STOP, f"eviction notice: {', '.join(draining)}")

    def _start_failures(self, job: JobRecord) -> dict[str, str]:
        """Nodes where a trainer of the current generation exited with an error before its first step."""
        found: dict[str, str] = {}
        for name in job.nodes:
            seen = self._reports(job, name)
            for r in seen.ranks if seen else ():
                started_nothing = r.last_step <= job.resume_step
                if r.job == job.id and r.generation == job.generation and r.exit_code and started_nothing:
                    found.setdefault(name, r.error or f"exit code {r.exit_code}")
        return found

    def _first_error(self, job: JobRecord) -> str:
        for name in job.nodes:
            seen = self._reports(job, name)
            for r in seen.ranks if seen else ():
                if r.job == job.id and r.generation == job.generation and r.exit_code and r.error:
                    return r.error
        return ""

    def start_morph(self, job_id: str, action: Action, cause: str, **fields: object) -> None:
        self.move_job(job_id, J.MORPHING, cause, action=action, morph_cause=cause, **fields)

    def advance_morph(self, job_id: str) -> None:
        job = self.jobs[job_id]
        started = job.morph_started_at if job.morph_started_at is not None else self.now
        if job.action is Action.STOP:
            gone = [n for n in job.nodes if not self._member(job, n)]
            if gone or self.now - started > self.config.stop_timeout_seconds:
                why = f"node gone while stopping: {', '.join(gone)}" if gone else "stop timed out"
                self.amend_job(job_id, action=Action.ABORT, morph_cause=f"{job.morph_cause}; {why}")
                job = self.jobs[job_id]
        expected, done, _, quiet = self._rank_states(job)
        if expected and done == expected:
            self.move_job(job_id, J.SUCCEEDED, f"finished step {job.spec.steps}")
            self.release_nodes(job_id, job.nodes, "job succeeded")
            return
        if not quiet and not (job.action is Action.ABORT and self.now - started > self.config.abort_timeout_seconds):
            return
        keep = [n for n in job.nodes if self._healthy(job, n)]
        self.release_nodes(job_id, job.nodes, f"generation {job.generation} of {job_id} ended")
        nodes = [(n, self.nodes[n].slots) for n in keep] + [
            (n.name, n.slots) for n in free_nodes(self.nodes) if n.name not in keep
        ]
        result = self._fit(job_id, nodes)
        if result is None:
            self.move_job(job_id, J.QUEUED, "no layout fits the nodes left; waiting for capacity")
            return
        self.start_generation(job_id, result[0], job.morph_cause)

    def _fit(self, job_id: str, nodes: Sequence[tuple[str, int]]) -> tuple[Plan, frozenset[str]] | None:
        planner = self.planners.get(job_id)
        if not isinstance(planner, Planner) or not nodes:
            return None
        job = self.jobs[job_id]
        nodes = [(name, slots) for name, slots in nodes if name not in job.excluded_nodes]
        if not nodes:
            return None
        result = planner.plan(nodes)
        if not isinstance(result, Plan) or result.gpus_used < job.spec.min_gpus:
            return None
        return result, frozenset(result.layout.nodes())

    def start_generation(self, job_id: str, plan: Plan, cause: str) -> None:
        job = self.jobs[job_id]
        generation = job.generation + 1
        layout = plan.layout
        rank0 = self.nodes[layout.placement[0].node]
        span = self.config.rendezvous_port_span
        port = self.config.rendezvous_port_base + (zlib.crc32(job_id.encode()) + generation) % span
        resume = job.last_checkpoint_step
        lost = max(0, job.step - resume) if job.generation else 0
        seconds = self.now - job.morph_started_at if job.morph_started_at is not None else None
        self.commands.append(StartGeneration(job_id, generation, layout, resume, cause, seconds, self.now))
        self.move_job(
            job_id,
            J.RUNNING,
            f"generation {generation}: {layout.describe()} ({cause})",
            generation=generation,
            layout=layout,
            rendezvous=f"{rank0.address}:{port}",
            resume_step=resume,
            step=resume,
            steps_lost=job.steps_lost + lost,
        )
        for name in layout.nodes():
            self.move_node(name, N.ASSIGNED, f"generation {generation} of {job_id}", job=job_id)

    def _debounced(self) -> bool:
        free = free_nodes(self.nodes)
        newest = max((n.joined_at for n in free), default=-1e300)
        return self.now - newest >= self.config.debounce_seconds

    def admit_queued(self) -> None:
        queued = [j for j in self.jobs.values() if j.state is J.QUEUED]
        for job in queued:
            problem = self.planners.get(job.id)
            if isinstance(problem, str):
                self.move_job(job.id, J.FAILED, problem)
        queued = [j for j in self.jobs.values() if j.state is J.QUEUED]
        if not queued or not self._debounced():
            return
        entries = [QueueEntry(j.id, j.spec.priority, j.submitted_at) for j in queued]
        free = [(n.name, n.slots) for n in free_nodes(self.nodes)]
        for job_id, plan in admit(entries, free, self._fit):
            self.start_generation(job_id, plan, "admitted" if not self.jobs[job_id].generation else "resumed")

    def grow(self) -> None:
        """Running jobs take free nodes when nobody waits, if the policy says the morph pays off."""
        if any(j.state is J.QUEUED for j in self.jobs.values()) or not self._debounced():
            return
        running = sorted(
            (j for j in self.jobs.values() if j.state is J.RUNNING and j.layout is not None),
            key=lambda j: (-j.spec.priority, j.submitted_at, j.id),
        )
        for job in running:
            free = free_nodes(self.nodes)
            planner = self.planners.get(job.id)
            if not free or not isinstance(planner, Planner) or job.layout is None:
                return
            current = planner.evaluate(job.layout)
            held = [(n, self.nodes[n].slots) for n in job.nodes]
            usable = [(n.name, n.slots) for n in free if n.name not in job.excluded_nodes]
            if not usable:
                continue
            candidate = planner.plan(held + usable)
            predicted = current.samples_per_second if isinstance(current, Plan) else None
            rate, scale = _measured_rate(job, self.now, predicted)
            remaining = max(0, job.spec.steps - job.step) * job.spec.global_batch / rate if rate else None
            decision = decide_morph(
                current_samples_per_second=rate,
                current_layout_intact=True,
                candidate_samples_per_second=candidate.samples_per_second * scale
                if isinstance(candidate, Plan)
                else None,
                morph_cost_seconds=self.config.morph_cost_seconds,
                config=self.config.policy,
                remaining_seconds=remaining,
            )
            if decision.morph:
                self.start_morph(job.id, Action.STOP, f"grow: {decision.detail}")


def _measured_rate(job: JobRecord, now: float, predicted: float | None) -> tuple[float | None, float]:
    """The job's samples/s as measured in its current generation, and measured / predicted.

    Profiles calibrated on one device can be far off on a busy host; the ratio of two predictions is
    more trustworthy than either, so the candidate is scaled by how far the current one was off.
    """
    elapsed = now - job.state_since
    done = job.step - job.resume_step
    if predicted is None or done <= 0 or elapsed <= 0:
        return predicted, 1.0
    measured = done * job.spec.global_batch / elapsed
    return measured, measured / predicted
