"""``spotmorph train``: run a job on this machine with P x D local trainer processes.

It resumes from the newest valid checkpoint in ``--checkpoint-dir``, trains until ``--steps`` and writes
a checkpoint at the end; how a user tries a model before submitting it, and how tests run layouts. The
flags build the same :class:`~morphing.jobspec.JobSpec` a submitted job has, with the same defaults.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from morphing.jobspec import DEVICES, DTYPES, PRECISIONS, SCHEDULES, JobSpec


def _default(field: str) -> Any:
    return JobSpec.model_fields[field].default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("entrypoint", help="path/to/file.py:function or package.module:function")
    parser.add_argument("--name", default="local-train", help="the job's name (default local-train)")
    parser.add_argument("--stages", type=int, default=1, help="pipeline stages P (default 1)")
    parser.add_argument("--replicas", type=int, default=1, help="data-parallel replicas D (default 1)")
    parser.add_argument(
        "--micro-batch-size",
        type=int,
        help="samples per micro-batch (default: one micro-batch per replica with 1 stage, about 2P with P stages)",
    )
    parser.add_argument("--global-batch", type=int, required=True, help="samples per optimizer step B")
    parser.add_argument("--steps", type=int, required=True, help="train until this step")
    parser.add_argument(
        "--checkpoint-dir", type=Path, required=True, help="where checkpoints go; a run resumes from the newest in it"
    )
    parser.add_argument("--dtype", choices=DTYPES, default=_default("dtype"), help="master weights and checkpoints")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=_default("precision"),
        help="compute: fp32, or bf16 / fp16 under autocast over float32 masters (default fp32)",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=_default("device"),
        help="auto (default): one GPU per rank when there are enough, else CPU; cuda: refuse to run without",
    )
    parser.add_argument(
        "--spawn-ranks",
        action="store_true",
        help="start each rank as a new Python interpreter (on the CPU they are forked from this process by "
        "default, which imported torch once for all of them)",
    )
    parser.add_argument(
        "--activation-recomputation",
        action="store_true",
        help="recompute each layer during backward instead of keeping its activations (less memory)",
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="the same bits in any layout (fp32, bf16): fixed micro-batches of --micro-batch-size, gradients "
        "summed in fixed point (slower; docs/runtime.md)",
    )
    parser.add_argument(
        "--seed", type=int, default=_default("seed"), help="seeds the model's initial weights and the data order"
    )
    parser.add_argument(
        "--schedule", choices=SCHEDULES, default=_default("schedule"), help="pipeline schedule (default %(default)s)"
    )
    parser.add_argument(
        "--checkpoint-interval",
        "--checkpoint-every",
        type=int,
        default=_default("checkpoint_interval"),
        help=f"also checkpoint every N steps; 0: only at the end (default {_default('checkpoint_interval')})",
    )
    parser.add_argument(
        "--eval-interval",
        type=int,
        default=_default("eval_interval"),
        help="evaluate the model's eval_dataset every N steps; 0 (default): never",
    )
    parser.add_argument("--keep", type=int, default=_default("keep"), help="checkpoints kept (default 3)")
    parser.add_argument("--background-checkpoint", action="store_true", help="write checkpoints in a thread")
    parser.add_argument(
        "--timeout-seconds",
        "--timeout",
        type=float,
        default=_default("timeout_seconds"),
        help=f"rendezvous, checkpoint and evaluation waits in seconds (default {_default('timeout_seconds'):g})",
    )
    parser.add_argument(
        "--peer-timeout-seconds",
        type=float,
        default=_default("peer_timeout_seconds"),
        help="how long a training step's collective waits for a peer "
        f"(default {_default('peer_timeout_seconds'):g}; above a step's time)",
    )
    parser.add_argument("--load-from", type=Path, help="start from this checkpoint instead of the newest")
    parser.add_argument("--run-dir", type=Path, help="job/layout files, progress-rank-R.jsonl, control/stop")
    parser.add_argument(
        "--log-interval",
        "--log-every",
        dest="log_interval",
        type=int,
        default=_default("log_interval"),
        help="print the step, loss, samples/s and layout every N steps, as trainers under a controller log them "
        f"(the job field log_interval; default {_default('log_interval')})",
    )


def job_spec(args: argparse.Namespace) -> JobSpec:
    """The job the flags describe; a bad value is a :class:`UserInputError` naming the field."""
    from morphing.jobspec import parse_job_spec

    fields = {
        "name": args.name,
        "entrypoint": args.entrypoint,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "seed": args.seed,
        "dtype": args.dtype,
        "precision": args.precision,
        "device": args.device,
        "activation_recomputation": args.activation_recomputation,
        "exact": args.exact,
        "schedule": args.schedule,
        "micro_batch_size": args.micro_batch_size,
        "checkpoint_interval": args.checkpoint_interval,
        "eval_interval": args.eval_interval,
        "log_interval": args.log_interval,
        "checkpoint_dir": str(args.checkpoint_dir),
        "keep": args.keep,
        "background_checkpoint": args.background_checkpoint,
        "timeout_seconds": args.timeout_seconds,
        "peer_timeout_seconds": args.peer_timeout_seconds,
    }
    return parse_job_spec(fields, what="job")


def run(args: argparse.Namespace) -> int:
    from morphing.layout import default_micro_batch_size, make_layout, unit_shares
    from worker_agent.runtime.checkpoint import check_same_job
    from worker_agent.runtime.entrypoint import build_spec
    from worker_agent.runtime.launcher import LocalRun, local_device, run_local

    job = job_spec(args)
    job = job.model_copy(update={"device": local_device(job.device, args.stages * args.replicas)})
    spec = build_spec(job.entrypoint, job.seed)
    micro = job.micro_batch_size or default_micro_batch_size(args.global_batch, args.stages, args.replicas)
    layout = make_layout(
        num_layers=len(spec.layers),
        pipeline_stages=args.stages,
        data_parallel=args.replicas,
        micro_batch_size=micro,
        global_batch=args.global_batch,
    )
    if job.exact:
        unit_shares(job.global_batch, micro, args.replicas)  # a replica without a micro-batch exits 2 here
    check_same_job(args.checkpoint_dir, job.identity())
    if args.load_from is not None:
        from worker_agent.runtime.checkpoint import resolve

        resolve(args.load_from, job.identity())
    print(
        f"spotmorph train: {spec.name}, layout {layout.describe()}, B={job.global_batch}, on {job.device}, "
        f"{job.dtype} weights" + ("" if job.precision == "fp32" else f", {job.precision} autocast"),
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="spotmorph-run-") as tmp:
        run_dir = args.run_dir or Path(tmp)
        local = LocalRun(
            job,
            layout,
            args.checkpoint_dir,
            run_dir,
            load_from=args.load_from,
            fork=not args.spawn_ranks,
        )
        return run_local(local)
