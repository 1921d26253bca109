"""Between the wire (protos/spotmorph/v1) and the agent's values; nothing else in the agent knows both.

The job spec crosses unchanged (:mod:`protos.jobspec`, the one conversion the controller uses too): an
optional field the controller left unset takes the model's default (:class:`morphing.jobspec.JobSpec`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.validation import MAX_JOB_ID, InvalidField, check_name, is_time
from protos.jobspec import spec_from_pb
from protos.spotmorph.v1 import controller_pb2 as pb
from worker_agent.agent.converge import Action, Assignment, TrainerKey
from worker_agent.agent.decisions import (
    CheckpointCommitted,
    EvictionNotice,
    EvictionRisk,
    PeerLost,
    TrainerExited,
    UrgentFact,
)
from worker_agent.agent.gpus import Gpu
from worker_agent.agent.progress import TrainerReport
from worker_agent.agent.supervisor import LaunchSpec
from worker_agent.contract import CommittedCheckpoint, ExitCode, SalvageOrder

log = logging.getLogger("spotmorph.agent")

MAX_HELD_SKIPPED = 1000  # characters of a trainer's reason for not taking the held state (the controller keeps fewer)

ACTIONS: dict[int, Action] = {
    pb.ACTION_RUN: "run",
    pb.ACTION_STOP: "stop",
    pb.ACTION_ABORT: "abort",
    pb.ACTION_HOLD: "hold",
}
IDLE = Assignment("", 0, "idle")
ERROR_CHARACTERS = 1000  # of a trainer's error, the tail the controller keeps


@dataclass(frozen=True)
class Registration:
    """Who the controller says this node is, and how often it wants to hear from it."""

    node_name: str
    incarnation: int
    node_token: str
    heartbeat_interval: float
    heartbeat_expiry: float  # the controller declares a node LOST after this much silence


@dataclass(frozen=True)
class Incoming:
    """An assignment as received: what to run and, unless idle, how to launch it."""

    assignment: Assignment
    launch: LaunchSpec | None = None


@dataclass(frozen=True)
class LogChunk:
    """Bytes of one rank's log file at ``offset`` (``eof``: its trainer exited and the file ends with them)."""

    key: TrainerKey
    offset: int
    data: bytes
    eof: bool = False


@dataclass(frozen=True)
class HeartbeatReply:
    incoming: Incoming
    heartbeat_interval: float | None  # None: keep the current one
    prepare: Prepare | None = None  # a free node's hint: the job a growth would most likely bring
    waited: bool = False  # the controller held the reply until something changed: beat again at once


@dataclass(frozen=True)
class Prepare:
    """A job a growth would most likely bring to this free node, and the spec its trainers would be given."""

    job_id: str
    spec: JobSpec


RENDEZVOUS_KEY = re.compile(r"[0-9a-f]{64}")  # what the controller derives for each generation


def registration_from_pb(reply: pb.RegisterResponse) -> Registration:
    return Registration(
        reply.node_name,
        reply.incarnation,
        reply.node_token,
        reply.heartbeat_interval_seconds or 1.0,
        reply.heartbeat_expiry_seconds or 10.0,
    )


def gpus_to_pb(gpus: tuple[Gpu, ...]) -> list[pb.Gpu]:
    return [pb.Gpu(index=g.index, name=g.name, memory_bytes=g.memory_bytes) for g in gpus]


def incoming_from_pb(message: pb.Assignment | None) -> Incoming:
    """An assignment message (absent or without a job: idle); a bad spec is a ``UserInputError``."""
    if message is None or not message.job:
        return Incoming(IDLE)
    action = ACTIONS.get(message.action, "idle")
    salvage = salvage_from_pb(message) if action == "hold" and message.HasField("salvage") else None
    assignment = Assignment(
        message.job,
        message.generation,
        action,
        tuple(message.ranks),
        message.checkpoint_request,
        tuple(message.slots),
        salvage,
        leaving=action == "stop" and message.leaving,
        await_leavers=action == "stop" and message.await_leavers and not message.leaving,
    )
    if assignment.action == "idle":
        return Incoming(assignment)
    spec = spec_from_pb(message.spec, what=f"job spec of {message.job}")
    if message.entrypoint:
        spec = spec.model_copy(update={"entrypoint": message.entrypoint})
    checkpoint_dir = Path(message.checkpoint_dir)
    # Exactly the checkpoint the controller committed; a controller that sends no generation (older than
    # format v2) committed one of the directories named by step alone, which generation 0 names.
    resume = CommittedCheckpoint(message.resume_step, message.resume_generation) if message.resume_step else None
    # Memory held by an older generation than this one only (a generation never takes its own or a newer one's).
    usable = message.held_step > 0 and message.held_generation < message.generation
    held = CommittedCheckpoint(message.held_step, message.held_generation) if usable else None
    if not RENDEZVOUS_KEY.fullmatch(message.rendezvous_key):
        raise UserInputError("the assignment's rendezvous_key is not 64 hex digits; the controller sends one")
    launch = LaunchSpec(
        spec,
        json.loads(message.layout.json),
        message.rendezvous_endpoint,
        checkpoint_dir,
        resume,
        held=held,
        rendezvous_key=message.rendezvous_key,
    )
    return Incoming(assignment, launch)


def salvage_from_pb(message: pb.Assignment) -> str:
    """The salvage order as the trainers read it (JSON); writers outside the layout are a ``UserInputError``."""
    order = message.salvage
    world = message.world_size
    if not order.writers or any(w >= world for w in order.writers) or len(set(order.writers)) != len(order.writers):
        raise UserInputError(f"salvage writers {list(order.writers)} are not distinct ranks of a world of {world}")
    if not is_time(order.deadline):
        raise UserInputError(f"salvage deadline {order.deadline!r} is not a time (unix seconds)")
    return SalvageOrder(order.step, tuple(order.writers), order.deadline).to_json()


def heartbeat_reply_from_pb(reply: pb.HeartbeatResponse) -> HeartbeatReply:
    """A heartbeat reply without an assignment means: run nothing."""
    incoming = incoming_from_pb(reply.assignment if reply.HasField("assignment") else None)
    return HeartbeatReply(incoming, reply.heartbeat_interval_seconds or None, prepare_from_pb(reply), reply.waited)


def prepare_from_pb(reply: pb.HeartbeatResponse) -> Prepare | None:
    """The hint's job and spec as the job's trainers would read it; an unusable one is dropped (it is only a
    hint, and must never keep the reply's assignment from being applied)."""
    if not reply.HasField("prepare") or not reply.prepare.job:
        return None
    try:
        job_id = check_name("prepare.job", reply.prepare.job, MAX_JOB_ID)
        spec = spec_from_pb(reply.prepare.spec, what=f"job spec of {job_id}")
    except (UserInputError, InvalidField) as exc:
        log.warning("ignoring the hint to prepare %r: %s", reply.prepare.job[:MAX_JOB_ID], exc)
        return None
    if reply.prepare.entrypoint:
        spec = spec.model_copy(update={"entrypoint": reply.prepare.entrypoint})
    return Prepare(job_id, spec)


def report_reply_from_pb(reply: pb.ReportEventResponse) -> Incoming | None:
    """A report's reply may carry the assignment as it now is; without one, nothing changes."""
    return incoming_from_pb(reply.assignment) if reply.HasField("assignment") else None


def trainer_status_to_pb(report: TrainerReport) -> pb.TrainerStatus:
    key = report.status.key
    status = pb.TrainerStatus(
        job=key.job_id,
        generation=key.generation,
        rank=key.rank,
        running=report.status.running,
        last_step=report.step,
        last_checkpoint_step=report.last_checkpoint_step or 0,
        error=report.error[-ERROR_CHARACTERS:],
    )
    if report.status.exit_code is not None:
        status.exit_code = report.status.exit_code
    if report.eval_loss is not None:  # within the controller's bounds: refusals.fit saw to that
        status.eval_step, status.eval_loss = report.eval_step, report.eval_loss
    if report.loss is not None:
        status.loss = report.loss
    if report.samples_per_second is not None:
        status.samples_per_second = report.samples_per_second
    if report.first_step_at is not None:
        status.first_step_at = report.first_step_at
    if report.first_step_seconds is not None:
        status.first_step_seconds = report.first_step_seconds
    if report.last_step_at is not None:
        status.last_step_at = report.last_step_at
    if report.held is not None:
        status.held_step = report.held.step
        status.snapshot_own_steps.extend(report.held.snapshot_own)
        status.snapshot_received_steps.extend(report.held.snapshot_received)
    status.refusal = refusal_to_pb(report)
    status.held_skipped = report.held_skipped[:MAX_HELD_SKIPPED]
    status.held_skipped_cause = report.held_skipped_cause
    status.hand_off_failed = report.hand_off_failed[:MAX_HELD_SKIPPED]
    stall = report.stall_seconds
    if stall is not None:
        status.checkpoint_stall_step, status.checkpoint_stall_seconds = report.stall_step, stall
    return status


def refusal_to_pb(report: TrainerReport) -> pb.TrainerRefusal.ValueType:
    """A trainer that exited 2 saying why (a user error) refused its input: the job's own, or what this node lacks.

    Exit 2 without the trainer's word (Python's own usage errors exit 2 too) is no refusal: it may be retried."""
    if report.status.exit_code != ExitCode.USER_ERROR:
        return pb.TRAINER_REFUSAL_UNSPECIFIED
    return _REFUSALS.get(report.failure or "", pb.TRAINER_REFUSAL_UNSPECIFIED)


_REFUSALS: dict[str, pb.TrainerRefusal.ValueType] = {
    "input": pb.TRAINER_REFUSAL_USER_INPUT,
    "node": pb.TRAINER_REFUSAL_NODE_UNFIT,
    "port_taken": pb.TRAINER_REFUSAL_PORT_TAKEN,
}


def heartbeat_to_pb(
    node: Registration,
    reports: list[TrainerReport],
    notice: EvictionNotice | None,
    building: str = "",
    wait_seconds: float = 0.0,
    risk: EvictionRisk | None = None,
) -> pb.HeartbeatRequest:
    request = pb.HeartbeatRequest(
        node_name=node.node_name,
        incarnation=node.incarnation,
        trainers=[trainer_status_to_pb(r) for r in reports],
        building=building,
        wait_seconds=wait_seconds,
    )
    if notice is not None:
        request.eviction.CopyFrom(pb.EvictionNotice(not_before=notice.not_before, source=notice.source))
    if risk is not None:
        request.risk.CopyFrom(pb.EvictionRisk(noticed_at=risk.noticed_at, source=risk.source))
    return request


def report_to_pb(node: Registration, fact: UrgentFact | EvictionNotice) -> pb.ReportEventRequest:
    """An urgent fact as the ``ReportEvent`` request that pushes it."""
    request = pb.ReportEventRequest(node_name=node.node_name, incarnation=node.incarnation)
    if isinstance(fact, TrainerExited):
        request.trainer_exited.CopyFrom(pb.TrainerExited(trainer=trainer_status_to_pb(fact.report)))
    elif isinstance(fact, PeerLost):
        held = fact.report.held
        assert held is not None  # a PeerLost is made only of a report that holds a step
        failed = pb.CollectiveFailed(trainer=trainer_status_to_pb(fact.report), stage=held.stage, replica=held.replica)
        request.collective_failed.CopyFrom(failed)
    elif isinstance(fact, CheckpointCommitted):
        committed = pb.CheckpointCommitted(job=fact.job_id, generation=fact.generation, step=fact.step)
        request.checkpoint_committed.CopyFrom(committed)
    else:
        request.eviction.CopyFrom(pb.EvictionNotice(not_before=fact.not_before, source=fact.source))
    return request


def log_chunks_to_pb(node: Registration, chunks: Sequence[LogChunk]) -> pb.ReportLogsRequest:
    return pb.ReportLogsRequest(
        node_name=node.node_name,
        incarnation=node.incarnation,
        chunks=[
            pb.LogChunk(
                job=c.key.job_id, generation=c.key.generation, rank=c.key.rank, offset=c.offset, text=c.data, eof=c.eof
            )
            for c in chunks
        ],
    )


def log_offsets_from_pb(reply: pb.ReportLogsResponse, chunks: Sequence[LogChunk]) -> list[int]:
    """How far the controller has each chunk's file; a reply that does not answer each chunk is unusable."""
    answered = [(o.job, o.generation, o.rank) for o in reply.offsets]
    if answered != [(c.key.job_id, c.key.generation, c.key.rank) for c in chunks]:
        raise UserInputError(f"the controller answered {len(answered)} log offsets for {len(chunks)} chunks sent")
    return [o.offset for o in reply.offsets]
