"""``spotmorph train``: run a job on this machine with P x D local trainer processes.

It resumes from the newest valid checkpoint in ``--checkpoint-dir``, trains until ``--steps`` and writes
a checkpoint at the end; how a user tries a model before submitting it, and how tests run layouts. The
flags build the same :class:`~morphing.jobspec.JobSpec` a submitted job has, with the same defaults.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from morphing.jobspec import JobSpec

# The job fields `spotmorph train` sets, each a flag named as the field (dashed) and the older names it keeps.
# Type, choices, default and description come from JobSpec: the CLI and the spec have one source.
JOB_FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("name", ()),
    ("global_batch", ()),
    ("steps", ()),
    ("micro_batch_size", ()),
    ("checkpoint_dir", ()),
    ("dtype", ()),
    ("precision", ()),
    ("device", ()),
    ("activation_recomputation", ()),
    ("exact", ()),
    ("seed", ()),
    ("schedule", ()),
    ("checkpoint_interval", ("--checkpoint-every",)),
    ("eval_interval", ()),
    ("keep", ()),
    ("background_checkpoint", ()),
    ("timeout_seconds", ("--timeout",)),
    ("peer_timeout_seconds", ()),
    ("log_interval", ("--log-every",)),
)
# What a flag means on this machine beyond the field's description, and the defaults only a local run has.
NOTES = {
    "micro_batch_size": "default: one micro-batch per replica with 1 stage, about 2P with P stages",
    "checkpoint_dir": "a run resumes from the newest in it",
    "checkpoint_interval": "here 0 checkpoints only at the end",
    "device": "here auto runs one GPU per rank when there are enough, else the CPU; cuda refuses to run without",
    "log_interval": "rank 0 prints them",
}
LOCAL_DEFAULTS: dict[str, Any] = {"name": "local-train"}
LOCAL_TYPES: dict[str, Callable[[str], Any]] = {"checkpoint_dir": Path}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("entrypoint", help="path/to/file.py:function or package.module:function")
    parser.add_argument("--stages", type=int, default=1, help="pipeline stages P (default 1)")
    parser.add_argument("--replicas", type=int, default=1, help="data-parallel replicas D (default 1)")
    for field, aliases in JOB_FLAGS:
        parser.add_argument(f"--{field.replace('_', '-')}", *aliases, dest=field, **job_option(field))
    parser.add_argument(
        "--spawn-ranks",
        action="store_true",
        help="start each rank as a new Python interpreter (on the CPU they are forked from this process by "
        "default, which imported torch once for all of them)",
    )
    parser.add_argument("--load-from", type=Path, help="start from this checkpoint instead of the newest")
    parser.add_argument("--run-dir", type=Path, help="job/layout files, progress-rank-R.jsonl, control/stop")


def job_option(field: str) -> dict[str, Any]:
    """``add_argument``'s keywords for the job field ``field``, from its type, default and description."""
    info = JobSpec.model_fields[field]
    kind = _plain(info.annotation)
    default = LOCAL_DEFAULTS.get(field, None if info.is_required() else info.default)
    said = "; ".join(part for part in (info.description, NOTES.get(field)) if part)
    if kind is bool:
        return {"action": "store_true", "help": said}
    option: dict[str, Any] = {"default": default, "required": default is None and info.is_required()}
    if get_origin(kind) is Literal:
        option["choices"] = get_args(kind)
    else:
        option["type"] = LOCAL_TYPES.get(field, kind)
    shown = f"{default:g}" if isinstance(default, float) else default
    option["help"] = said + ("" if default is None else f" (default {shown})")
    return option


def _plain(annotation: Any) -> Any:
    """``int`` of ``PositiveInt | None``; a Literal stays itself."""
    if get_origin(annotation) in (Union, UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def job_spec(args: argparse.Namespace) -> JobSpec:
    """The job the flags describe; a bad value is a :class:`UserInputError` naming the field."""
    from morphing.jobspec import parse_job_spec

    fields = {field: getattr(args, field) for field, _ in JOB_FLAGS}
    fields.update(entrypoint=args.entrypoint, checkpoint_dir=str(args.checkpoint_dir))
    return parse_job_spec(fields, what="job")


def run(args: argparse.Namespace) -> int:
    from morphing.layout import default_micro_batch_size, make_layout, unit_shares
    from worker_agent.runtime.model.entrypoint import build_spec
    from worker_agent.runtime.process.launcher import LocalRun, local_device, run_local
    from worker_agent.runtime.storage.checkpoint import check_same_job

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
        from worker_agent.runtime.storage.checkpoint import resolve

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
