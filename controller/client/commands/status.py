"""``spotmorph status JOB``: one job in detail, with its morphs."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from controller.client.commands.common import add_client_arguments, call, describe_layout, dump, job_dict
from controller.eventlog.fact import decode_fact
from controller.eventlog.facts import TrainingProgressed
from morphing.errors import UserInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job id, e.g. job-1")
    parser.add_argument("--watch", "-w", action="store_true", help="a live view until the job ends")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes with --watch")
    add_client_arguments(parser)


TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """The last ``width`` values as bars from the lowest (▁) to the highest (█)."""
    shown = list(values)[-width:]
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    span = high - low
    return "".join(SPARKS[0 if span == 0 else min(7, int((v - low) / span * 8))] for v in shown)


def training_line(job: dict[str, Any]) -> str:
    """The newest step's loss and rate as status shows them."""
    rate = job.get("samples_per_second")
    speed = f", {rate:.1f} samples/s" if rate is not None else ""
    return f"loss {job['loss']:.4f} at step {job['loss_step']}{speed}"


def watch_view(
    job: dict[str, Any], last_morph_at: float | None, now: float, width: int = 40, losses: Sequence[float] = ()
) -> str:
    """The ``--watch`` screen: a progress bar of steps, the layout, the time since the last morph, and the loss
    so far as a sparkline (``losses``: the TrainingProgressed events', oldest first)."""
    total = max(1, int(job["total_steps"]))
    done = min(width, int(width * int(job["step"]) / total))
    since = "never" if last_morph_at is None else f"{now - last_morph_at:.0f}s ago"
    lines = [
        f"{job['id']} ({job['name']}): {job['state']}",
        f"  [{'#' * done}{'.' * (width - done)}] {job['step']}/{job['total_steps']} steps",
        f"  generation {job['generation']}, layout {describe_layout(job)}, last morph {since}",
        f"  last checkpoint at step {job['last_checkpoint_step']}, steps lost {job['steps_lost']}",
    ]
    if job.get("loss") is not None:
        lines.append(f"  {training_line(job)}")
        history = [*losses, job["loss"]]
        if len(history) > 1:
            lines.append(f"  loss {sparkline(history, width)} ({min(history):.4f} .. {max(history):.4f})")
    if job.get("eval_loss") is not None:
        lines.append(f"  eval loss {job['eval_loss']:.4f} at step {job['eval_step']}")
    if job.get("checkpoint_stall_seconds") is not None:
        lines.append(f"  {stall_line(job)}")
    if job["reason"]:
        lines.append(f"  {job['reason']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    if args.watch:
        return _watch(args)
    reply, code = call(args, lambda ch: rpc.JobsStub(ch).GetJob(pb.GetJobRequest(id=args.job)))
    if reply is None:
        return code
    job = job_dict(reply)
    if args.json:
        dump(job)
        return 0
    print(f"{job['id']} ({job['name']}): {job['state']}  step {job['step']}/{job['total_steps']}")
    print(f"  generation {job['generation']}, layout {describe_layout(job)}")
    print(f"  checkpoints in {job['checkpoint_dir']}, last at step {job['last_checkpoint_step']}")
    print(f"  steps lost {job['steps_lost']}, restarts {job['restarts']}")
    if job["snapshots"]:
        print(f"  {job['snapshots']}")
    if job["reason"]:
        print(f"  {job['failure_cause']}: {job['reason']}" if job["failure_cause"] else f"  {job['reason']}")
    if job["loss"] is not None:
        print(f"  {training_line(job)}")
    if job["eval_loss"] is not None:
        print(f"  eval loss {job['eval_loss']:.4f} at step {job['eval_step']}")
    if job["checkpoint_stall_seconds"] is not None:
        print(f"  {stall_line(job)}")
    for line in on_demand_lines(job):
        print(f"  {line}")
    for morph in job["morphs"]:
        print(f"  {morph_line(morph)}")
    return 0


# What each on-demand cause (scheduler.deadlines.CapacityCause, a label on the wire) means, as status says it.
CAUSE_WORDS = {
    "deadline_at_risk": "the deadline is at risk on spot alone",
    "last_safe_moment": "past the last safe moment: only its on-demand GPUs still meet the deadline",
    "behind_uniform_progress": "behind uniform progress",
    "on_demand_only": "on-demand only",
    "spot_returned": "given back: spot alone meets the deadline again",
    "job_done": "given back: the job ended",
}


def on_demand_lines(job: dict[str, Any]) -> list[str]:
    """Why the job holds on-demand capacity and the numbers behind it; the step-time prediction's error."""
    lines = []
    hold = job.get("on_demand")
    if hold is not None:
        lines.append(f"on-demand: {hold['gpus']} GPU(s) wanted, {hold['held_gpus']} held: {_why(hold)}")
        left = hold["deadline_in_seconds"]
        deadline = "no deadline" if left is None else f"deadline in {left:.0f} s"
        finish = "never" if hold["finish_seconds"] is None else f"in {hold['finish_seconds']:.0f} s"
        lines.append(
            f"  {deadline}, {hold['remaining_samples']:.0f} samples left; on {hold['spot_gpus']} spot GPU(s) "
            f"{hold['spot_samples_per_second']:.1f} samples/s expected (done {finish}), "
            f"{hold['with_on_demand_samples_per_second']:.1f} with on-demand"
        )
        price, spent = hold["gpu_hour_price"], hold.get("spent_dollars", hold["cost_dollars"])
        if hold["held_nodes"]:
            nodes = ", ".join(hold["held_nodes"])
            lines.append(f"  on {nodes}: ${hold['cost_dollars']:.2f} so far at ${price:.2f}/GPU-hour")
        if spent > hold["cost_dollars"]:
            lines.append(f"  on-demand capacity in all: ${spent:.2f}, the nodes given back included")
    checked = job.get("step_time")
    if checked is not None and checked["error_before"] is not None:
        after = "-" if checked["error_after"] is None else f"{checked['error_after']:.0%}"
        lines.append(
            f"step time predicted {checked['error_before']:.0%} off, {after} after the correction "
            f"(generation {checked['generation']}, {checked['checks']} measurement(s))"
        )
    return lines


def _why(hold: dict[str, Any]) -> str:
    cause = hold["cause"]
    if cause is None:
        return "spot alone meets the deadline" if not hold["held_gpus"] else "held"
    return f"{cause} ({CAUSE_WORDS[cause]})" if cause in CAUSE_WORDS else str(cause)


def stall_line(job: dict[str, Any]) -> str:
    """The newest checkpoint's stall as status shows it (milliseconds: a background checkpoint's copy is short)."""
    return (
        f"checkpoint at step {job['checkpoint_stall_step']} paused training "
        f"{job['checkpoint_stall_seconds'] * 1e3:.1f} ms"
    )


def morph_line(morph: dict[str, Any]) -> str:
    """A morph as status shows it: the pause training felt (and of it, the time no rank could step) beside the
    controller's decision time."""
    pause, stalled = morph["pause_seconds"], morph["stalled_seconds"]
    felt = "pause not measured yet" if pause is None else f"training paused {pause:.1f} s"
    if pause is not None and stalled is not None:
        felt += f" ({stalled:.1f} s stalled, then the first step)"
    at = f"resumed at step {morph['resumed_at_step']}"
    decided = f"decided in {morph['seconds']:.1f} s"
    return f"morph to generation {morph['generation']}, {at}: {felt}, {decided}: {morph['cause']}"


def _watch(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    if args.interval <= 0:
        raise UserInputError(f"--interval {args.interval}: it must be > 0 seconds")

    def snapshot(channel: Any) -> tuple[dict[str, Any], float | None, list[float]]:
        stub = rpc.JobsStub(channel)
        job = job_dict(stub.GetJob(pb.GetJobRequest(id=args.job)))
        events = list(stub.WatchEvents(pb.WatchEventsRequest(job=args.job)))
        issued = [e.at for e in events if e.kind == "GenerationIssued"]
        losses = [loss_of(e.data_json) for e in events if e.kind == "TrainingProgressed"]
        return job, (issued[-1] if len(issued) > 1 else None), [x for x in losses if x is not None]

    tty = sys.stdout.isatty()
    while True:
        found, code = call(args, snapshot)
        if found is None:
            return code
        job, last_morph, losses = found
        view = watch_view(job, last_morph, time.time(), losses=losses)
        if args.json:
            print(json.dumps({**job, "last_morph_at": last_morph}), flush=True)
        else:
            print(("\x1b[H\x1b[2J" if tty else "") + view + ("" if tty else "\n"), flush=True)
        if job["state"] in TERMINAL:
            return 0 if job["state"] == "SUCCEEDED" else 1
        time.sleep(args.interval)


def loss_of(data_json: str) -> float | None:
    """A TrainingProgressed event's loss (None when it has none, or its data is not what the controller writes)."""
    try:
        loss = decode_fact(TrainingProgressed, json.loads(data_json)).loss
    except ValueError:  # not JSON, or not a TrainingProgressed's data (EventDataError)
        return None
    return loss if loss is not None and math.isfinite(loss) else None
