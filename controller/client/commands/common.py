"""Options and output shared by the client commands (no grpc import at module level)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from morphing.errors import UserInputError

# Exit codes scripts can rely on: 0 ok, 2 bad input (also bad flags), 3 not found, 4 refused
# (auth), 5 controller unreachable or none leads now (retry later), 6 wrong state (e.g. cancelling a
# finished job).
EXIT_NOT_FOUND, EXIT_DENIED, EXIT_UNAVAILABLE, EXIT_STATE = 3, 4, 5, 6
T = TypeVar("T")


def number(flag: str, value: str | None, least: int, most: int, fix: str) -> int | None:
    """``value`` of ``flag`` as a whole number from ``least`` to ``most``; None when the flag was not given."""
    if value is None:
        return None
    try:
        parsed = int(value, 10)
    except ValueError:
        parsed = None
    if parsed is None or not least <= parsed <= most:
        raise UserInputError(f"{flag} {value!r}: {fix}")
    return parsed


def add_client_arguments(parser: argparse.ArgumentParser, json_flag: bool = True) -> None:
    parser.add_argument(
        "--controller",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the controller, or several (one leads, the others stand by); default: $SPOTMORPH_CONTROLLER, "
        "else the context file",
    )
    parser.add_argument(
        "--token", help="default: $SPOTMORPH_TOKEN, else the context file (--token=VALUE if VALUE starts with -)"
    )
    parser.add_argument("--tls-ca", type=Path, help="CA certificate of the controller (enables TLS)")
    parser.add_argument("--tls-cert", type=Path, help="client certificate for mutual TLS")
    parser.add_argument("--tls-key", type=Path, help="client key for mutual TLS")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="machine-readable output")


def call(args: argparse.Namespace, make: Callable[[Any], T]) -> tuple[T | None, int]:
    """Run ``make(channel)`` once a controller answers (``make`` may do slow local work first, such as
    building a model); reads go to the first listed controller that answers, writes it refuses as a standby to
    the leader (:mod:`controller.client.leader`). No answer, no leader and RPC errors become one line on stderr
    and a documented exit code."""
    import grpc

    from controller.client import connection as client
    from controller.client.leader import LeaderChannel, NoLeader, Route

    addresses, token = client.resolve(args.controller, args.token)
    opener = client.Opener.of(token, args.tls_ca, args.tls_cert, args.tls_key)
    codes = {
        grpc.StatusCode.INVALID_ARGUMENT: 2,
        grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
        grpc.StatusCode.UNAUTHENTICATED: EXIT_DENIED,
        grpc.StatusCode.PERMISSION_DENIED: EXIT_DENIED,
        grpc.StatusCode.UNAVAILABLE: EXIT_UNAVAILABLE,
        grpc.StatusCode.FAILED_PRECONDITION: EXIT_STATE,
    }
    channel: LeaderChannel | None = None
    try:
        address, first = client.wait_until_answers(addresses, opener, client.address_source(args.controller))
        channel = LeaderChannel(Route(address, first, addresses, opener))
        return make(channel), 0
    except (client.ControllerUnreachable, NoLeader) as exc:
        print(f"spotmorph {args.command}: {exc}", file=sys.stderr)
        return None, EXIT_UNAVAILABLE
    except grpc.RpcError as exc:
        code = exc.code()
        print(f"spotmorph {args.command}: {code.name}: {exc.details()}", file=sys.stderr)
        return None, codes.get(code, 1)
    finally:
        if channel is not None:
            channel.close()


MAX_PAGES = 100_000  # 100 million items at the controller's default page size: far beyond any cluster


def follow_pages(fetch: Callable[[str], Any], field: str) -> list[Any]:
    """Every item of a paged list: ``fetch(token)`` is one reply; its ``field`` items, then the next page."""
    items: list[Any] = []
    token = ""
    for _ in range(MAX_PAGES):
        reply = fetch(token)
        items += getattr(reply, field)
        if not reply.next_page_token or reply.next_page_token == token:
            return items
        token = reply.next_page_token
    raise UserInputError(f"the controller sent more than {MAX_PAGES} pages of {field}; is it a spotmorph controller?")


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def dump(data: object) -> None:
    print(json.dumps(data, indent=2, sort_keys=True))


def need(value: str, what: str) -> str:
    if not value:
        raise UserInputError(f"{what} is required")
    return value


def job_dict(job: Any) -> dict[str, Any]:
    """The ``status --json`` shape (a contract for scripts)."""
    from protos.spotmorph.v1 import controller_pb2 as pb

    layout = None
    if job.HasField("layout"):
        layout = {
            "pipeline_stages": job.layout.pipeline_stages,
            "data_parallel": job.layout.data_parallel,
            "micro_batch_size": job.layout.micro_batch_size,
            "global_batch": job.layout.global_batch,
            "detail": json.loads(job.layout.json) if job.layout.json else None,
        }
    return {
        "id": job.id,
        "name": job.name,
        "state": pb.JobState.Name(job.state).removeprefix("JOB_STATE_"),
        "step": job.step,
        "total_steps": job.total_steps,
        "generation": job.generation,
        "layout": layout,
        "checkpoint_dir": job.checkpoint_dir,
        "last_checkpoint_step": job.last_checkpoint_step,
        "steps_lost": job.steps_lost,
        "snapshots": job.snapshots,
        "morphs": [
            {
                "generation": m.generation,
                "cause": m.cause,
                "seconds": m.seconds,  # the decision: from the morph's start to the generation's issue
                "pause_seconds": m.pause_seconds if m.HasField("pause_seconds") else None,  # what training felt
                # of it, the time no rank could step (the rest: the new generation's first step)
                "stalled_seconds": m.stalled_seconds if m.HasField("stalled_seconds") else None,
                "resumed_at_step": m.resumed_at_step,  # from memory it held, or its checkpoint
            }
            for m in job.morphs
        ],
        "loss": job.loss if job.HasField("loss") else None,  # the newest step's training loss (global batch)
        "loss_step": job.loss_step if job.HasField("loss") else None,
        "samples_per_second": job.samples_per_second if job.HasField("samples_per_second") else None,
        "eval_loss": job.eval_loss if job.HasField("eval_loss") else None,
        "eval_step": job.eval_step if job.HasField("eval_loss") else None,
        # how long the newest checkpoint paused training, and its step (null before the first checkpoint)
        "checkpoint_stall_seconds": job.checkpoint_stall_seconds if job.HasField("checkpoint_stall_seconds") else None,
        "checkpoint_stall_step": job.checkpoint_stall_step if job.HasField("checkpoint_stall_seconds") else None,
        "priority": job.priority,
        "reason": job.reason,
        "failure_cause": job.failure_cause or None,  # a FAILED job's cause label (user_error, ...); None otherwise
        "restarts": job.restarts,
        "rendezvous_endpoint": job.rendezvous_endpoint,
        # why it holds on-demand capacity and the numbers behind it (null: it may use none and holds none)
        "on_demand": on_demand_dict(job.on_demand) if job.HasField("on_demand") else None,
        # the newest check of the planner's step time (null: none yet); errors as fractions of the measured time
        "step_time": step_time_dict(job.step_time) if job.HasField("step_time") else None,
    }


def _optional(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def on_demand_dict(hold: Any) -> dict[str, Any]:
    """A job's on-demand hold in ``status --json``."""
    return {
        "gpus": hold.gpus,  # the level the scheduler wants it to hold
        "cause": hold.cause or None,  # scheduler.deadlines.CapacityCause
        "since": _optional(hold, "since"),
        "deadline_in_seconds": _optional(hold, "deadline_in_seconds"),
        "remaining_samples": hold.remaining_samples,
        "spot_gpus": hold.spot_gpus,  # at the decision that set the level, as the speeds
        "spot_samples_per_second": hold.spot_samples_per_second,
        "with_on_demand_samples_per_second": hold.with_on_demand_samples_per_second,
        "finish_seconds": _optional(hold, "finish_seconds"),  # on spot alone (null: never)
        "held_gpus": hold.held_gpus,
        "held_nodes": list(hold.held_nodes),
        "cost_dollars": hold.cost_dollars,  # of the nodes held now, since each joined
        "gpu_hour_price": hold.gpu_hour_price,
        "spent_dollars": hold.spent_dollars,  # all its on-demand capacity, the nodes given back included
    }


def step_time_dict(check: Any) -> dict[str, Any]:
    return {
        "generation": check.generation,
        "checks": check.checks,
        "error_before": _optional(check, "error_before"),
        "error_after": _optional(check, "error_after"),
    }


def describe_layout(job: dict[str, Any]) -> str:
    layout = job["layout"]
    if not layout:
        return "-"
    return f"{layout['pipeline_stages']}x{layout['data_parallel']} m={layout['micro_batch_size']}"
