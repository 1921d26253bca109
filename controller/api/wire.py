"""Between the wire (protos/spotmorph/v1) and the controller's values; nothing else knows both."""

from __future__ import annotations

import json
from collections.abc import Sequence

from controller.core.model import Assignment, Gpu, JobRecord, NodeRecord, RankReport, SalvageOrder
from controller.core.observations import Refusal
from controller.core.scheduler_status import OnDemandStatus, StepTimeStatus, step_time_status
from controller.core.stimulus import Stimulus
from controller.persistence.store import GenerationRow
from morphing.layout import Layout
from morphing.snapshots import protection
from morphing.transfer import HeldSkipCause
from morphing.validation import InvalidField
from protos.jobspec import spec_to_pb
from protos.spotmorph.v1 import controller_pb2 as pb

MAX_GPUS = 1024  # per node, like slots
MAX_GPU_NAME = 256
MAX_GPU_MEMORY = 1 << 50  # a PiB: anything larger is a broken report


def gpus_from_pb(gpus: Sequence[pb.Gpu]) -> tuple[Gpu, ...]:
    """A registration's GPUs; :class:`InvalidField` for a report no real node makes."""
    if len(gpus) > MAX_GPUS:
        raise InvalidField("gpus", f"at most {MAX_GPUS} per node")
    if len({g.index for g in gpus}) != len(gpus):
        raise InvalidField("gpus", "each index once")
    for i, g in enumerate(gpus):
        if not g.name or len(g.name) > MAX_GPU_NAME or not g.name.isprintable():
            raise InvalidField(f"gpus[{i}].name", f"1..{MAX_GPU_NAME} printable characters")
        if g.memory_bytes > MAX_GPU_MEMORY:
            raise InvalidField(f"gpus[{i}].memory_bytes", f"{g.memory_bytes} is more than a GPU has")
    return tuple(Gpu(g.index, g.name, g.memory_bytes) for g in gpus)


def layout_to_pb(layout: Layout | None) -> pb.Layout | None:
    if layout is None:
        return None
    return pb.Layout(
        pipeline_stages=layout.pipeline_stages,
        data_parallel=layout.data_parallel,
        micro_batch_size=layout.micro_batch_size,
        global_batch=layout.global_batch,
        json=json.dumps(layout.to_dict(), sort_keys=True),
    )


def job_to_pb(
    job: JobRecord, generations: Sequence[GenerationRow] = (), on_demand: OnDemandStatus | None = None
) -> pb.Job:
    """``on_demand``: the job's hold as :func:`controller.core.scheduler_status.on_demand_status` gives it (it
    needs the nodes, the clock and the price, which the view has)."""
    morphs = [
        pb.Morph(
            generation=g.generation,
            cause=g.cause,
            seconds=g.morph_seconds or 0.0,
            pause_seconds=g.pause_seconds,
            stalled_seconds=g.stalled_seconds,
            resumed_at_step=g.resumed_at_step,
        )
        for g in generations
        if g.morph_seconds is not None
    ]
    message = pb.Job(
        id=job.id,
        name=job.spec.name,
        state=pb.JobState.Value(f"JOB_STATE_{job.state}"),
        step=job.step,
        total_steps=job.spec.steps,
        generation=job.generation,
        layout=layout_to_pb(job.layout),
        checkpoint_dir=job.spec.checkpoint_dir,
        last_checkpoint_step=job.last_checkpoint.step,
        steps_lost=job.steps_lost,
        morphs=morphs,
        priority=job.spec.priority,
        reason=job.reason,
        submitted_at=job.submitted_at,
        spec=spec_to_pb(job.spec),
        restarts=job.restarts,
        rendezvous_endpoint=job.rendezvous,
        eval_step=job.evaluation.step,
        failure_cause=str(job.failure_cause or ""),
        snapshots=protection(job.layout, job.spec.snapshot_interval, job.spec.morph_through_memory),
    )
    if job.evaluation.loss is not None:
        message.eval_loss = job.evaluation.loss
    if job.training.loss is not None:
        message.loss, message.loss_step = job.training.loss, job.training.step
    if job.training.samples_per_second is not None:
        message.samples_per_second = job.training.samples_per_second
    if job.checkpoint_stall.seconds is not None:
        message.checkpoint_stall_step = job.checkpoint_stall.step
        message.checkpoint_stall_seconds = job.checkpoint_stall.seconds
    if on_demand is not None:
        message.on_demand.CopyFrom(on_demand_to_pb(on_demand))
    if (checked := step_time_status(job)) is not None:
        message.step_time.CopyFrom(step_time_to_pb(checked))
    return message


def on_demand_to_pb(status: OnDemandStatus) -> pb.OnDemandHold:
    return pb.OnDemandHold(
        gpus=status.gpus,
        cause=str(status.cause or ""),
        since=status.since,
        deadline_in_seconds=status.deadline_in_seconds,
        remaining_samples=status.remaining_samples,
        spot_gpus=status.spot_gpus,
        spot_samples_per_second=status.spot_samples_per_second,
        with_on_demand_samples_per_second=status.with_on_demand_samples_per_second,
        finish_seconds=status.finish_seconds,
        held_gpus=status.held_gpus,
        held_nodes=list(status.held_nodes),
        cost_dollars=status.cost_dollars,
        gpu_hour_price=status.gpu_hour_price,
        spent_dollars=status.spent_dollars,
    )


def step_time_to_pb(status: StepTimeStatus) -> pb.StepTimeCheck:
    return pb.StepTimeCheck(
        generation=status.generation,
        checks=status.checks,
        error_before=status.error_before,
        error_after=status.error_after,
    )


def node_to_pb(node: NodeRecord) -> pb.Node:
    message = pb.Node(
        name=node.name,
        incarnation=node.incarnation,
        state=pb.NodeState.Value(f"NODE_STATE_{node.state}"),
        slots=node.slots,
        job=node.job or "",
        address=node.address,
        state_since=node.state_since,
        gpus=[pb.Gpu(index=g.index, name=g.name, memory_bytes=g.memory_bytes) for g in node.gpus],
        pool=str(node.pool),
        owner=node.owner or "",
    )
    if node.eviction_not_before is not None:
        message.eviction_not_before = node.eviction_not_before
    return message


def assignment_to_pb(
    assignment: Assignment | None,
    layout: pb.Layout | None = None,
    spec: pb.JobSpec | None = None,
    rendezvous_key: str = "",
) -> pb.Assignment | None:
    """``layout``/``spec``: the wire form of the assignment's layout and spec when the caller keeps them;
    ``rendezvous_key``: the generation's (:meth:`controller.tokens.Tokens.rendezvous_key`)."""
    if assignment is None:
        return None
    return pb.Assignment(
        job=assignment.job,
        generation=assignment.generation,
        ranks=list(assignment.ranks),
        slots=list(assignment.slots),
        layout=layout or layout_to_pb(assignment.layout),
        rendezvous_endpoint=assignment.rendezvous,
        checkpoint_dir=assignment.checkpoint_dir,
        resume_step=assignment.resume.step,
        resume_generation=assignment.resume.generation,
        action=pb.Action.Value(f"ACTION_{assignment.action}"),
        entrypoint=assignment.entrypoint,
        spec=spec or spec_to_pb(assignment.spec),
        checkpoint_request=assignment.checkpoint_request,
        world_size=assignment.layout.world_size,
        salvage=salvage_to_pb(assignment.salvage),
        held_step=assignment.held.step,
        held_generation=assignment.held.generation,
        rendezvous_key=rendezvous_key,
        leaving=assignment.leaving,
        await_leavers=assignment.await_leavers,
    )


def salvage_to_pb(salvage: SalvageOrder | None) -> pb.Salvage | None:
    if salvage is None:
        return None
    return pb.Salvage(step=salvage.step, writers=list(salvage.writers), deadline=salvage.deadline)


def rank_from_pb(status: pb.TrainerStatus, error: str, held_skipped: str = "", hand_off_failed: str = "") -> RankReport:
    """A trainer's status as a rank report (``error``, ``held_skipped``, ``hand_off_failed``: texts as the caller
    keeps them; its ``held_skipped_cause`` one of :class:`HeldSkipCause`'s values or empty, as the caller
    checked)."""
    return RankReport(
        job=status.job,
        generation=status.generation,
        rank=status.rank,
        running=status.running,
        exit_code=status.exit_code if status.HasField("exit_code") else None,
        last_step=status.last_step,
        last_checkpoint_step=status.last_checkpoint_step,
        error=error,
        eval_step=status.eval_step,
        eval_loss=status.eval_loss if status.HasField("eval_loss") else None,
        first_step_at=status.first_step_at if status.HasField("first_step_at") else None,
        first_step_seconds=status.first_step_seconds if status.HasField("first_step_seconds") else None,
        last_step_at=status.last_step_at if status.HasField("last_step_at") else None,
        held_step=status.held_step if status.HasField("held_step") else None,
        snapshot_own_steps=tuple(status.snapshot_own_steps),
        snapshot_received_steps=tuple(status.snapshot_received_steps),
        refusal=_REFUSALS.get(status.refusal),
        stall_step=status.checkpoint_stall_step,
        stall_seconds=status.checkpoint_stall_seconds if status.HasField("checkpoint_stall_seconds") else None,
        held_skipped=held_skipped,
        hand_off_failed=hand_off_failed,
        held_skipped_cause=HeldSkipCause(status.held_skipped_cause) if status.held_skipped_cause else None,
        loss=status.loss if status.HasField("loss") else None,
        samples_per_second=status.samples_per_second if status.HasField("samples_per_second") else None,
    )


_REFUSALS = {
    pb.TRAINER_REFUSAL_USER_INPUT: Refusal.USER_INPUT,
    pb.TRAINER_REFUSAL_NODE_UNFIT: Refusal.NODE_UNFIT,
    pb.TRAINER_REFUSAL_PORT_TAKEN: Refusal.PORT_TAKEN,
}


def stimulus_to_pb(stimulus: Stimulus | None) -> pb.Stimulus | None:
    """What triggered a decision, on an event of it (None: a decision older than their record)."""
    if stimulus is None:
        return None
    return pb.Stimulus(
        kind=str(stimulus.kind),
        source=stimulus.source,
        node=stimulus.node or "",
        incarnation=stimulus.incarnation,
        job=stimulus.job or "",
        caller=stimulus.caller or "",
    )
