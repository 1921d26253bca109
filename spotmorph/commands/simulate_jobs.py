"""``spotmorph simulate --jobs JOBS.yaml``: several jobs on one spot trace, per scheduling policy.

The shell of :mod:`scheduler.fleet`: it reads the jobs file (YAML, checked field by field), each job's profile
(paths relative to the file) into its planner's throughput curve, and prints the outcome.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from pydantic import ValidationError as PydanticValidationError

from morphing.errors import UserInputError, describe_validation_error
from morphing.planner import Planner
from morphing.replay import ReplayConfig
from morphing.traces import Trace
from scheduler.fleet import POLICIES, FleetConfig, FleetJob, simulate_jobs
from scheduler.jobs import OnDemand, throughput_curve
from scheduler.layouts import options
from spotmorph.commands.plan import load_profile

JOBS_DOCS = "see `spotmorph simulate --help` and README.md (Trace-driven what-if)"


class JobEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    profile: str = Field(min_length=1)
    global_batch: PositiveInt
    steps: PositiveInt
    max_gpus: PositiveInt
    priority: int = 0
    deadline_hours: PositiveFloat | None = None
    submit_hour: NonNegativeFloat = 0.0
    on_demand: Literal["allowed", "never"] = "allowed"
    on_demand_cap_gpus: NonNegativeInt | None = None


class JobsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    jobs: list[JobEntry] = Field(min_length=1)


def parse_policies(text: str | None) -> tuple[str, ...]:
    if text is None:
        return tuple(POLICIES)
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown or not chosen:
        raise UserInputError(
            f"--policies {text!r}: unknown policy {', '.join(unknown) or '(none given)'}; use any of "
            f"{', '.join(POLICIES)}, comma-separated"
        )
    return chosen


def read_jobs(path: Path, gpus_per_node: int, layouts: bool = False) -> list[FleetJob]:
    """The jobs of the file at ``path``; ``layouts``: each with the planner's candidate layouts at every GPU count
    (``scheduler.layouts.options``), which the replay runs and charges losses by."""
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"jobs file {path} cannot be read ({exc.__class__.__name__}); pass a YAML file") from None
    except yaml.YAMLError as exc:
        raise UserInputError(f"jobs file {path} is not YAML ({str(exc).splitlines()[0]})") from None
    try:
        parsed = JobsFile.model_validate(data)
    except PydanticValidationError as exc:
        raise UserInputError(describe_validation_error(exc, f"jobs file {path}", JOBS_DOCS, ("jobs",))) from None
    names = [job.name for job in parsed.jobs]
    if len(set(names)) != len(names):
        raise UserInputError(f"jobs file {path}: job names repeat ({', '.join(names)}); give each job its own name")
    return [_fleet_job(job, path.parent, gpus_per_node, layouts) for job in parsed.jobs]


def _fleet_job(job: JobEntry, base: Path, gpus_per_node: int, layouts: bool) -> FleetJob:
    profile = Path(job.profile) if Path(job.profile).is_absolute() else base / job.profile
    if not profile.is_file():
        raise UserInputError(
            f"job {job.name}: profile {profile} not found; profile paths are relative to the jobs file "
            "(measure one with `spotmorph profile`)"
        )
    planner = Planner(load_profile(str(profile)), job.global_batch)
    rates = throughput_curve(planner, job.max_gpus, gpus_per_node)
    if rates[-1] <= 0:
        raise UserInputError(f"job {job.name}: no layout fits {job.max_gpus} GPUs; raise max_gpus (try spotmorph plan)")
    return FleetJob(
        name=job.name,
        rates=rates,
        global_batch=job.global_batch,
        steps=job.steps,
        priority=job.priority,
        deadline_hours=job.deadline_hours,
        submit_hour=job.submit_hour,
        on_demand=OnDemand(job.on_demand),
        on_demand_cap_gpus=job.on_demand_cap_gpus,
        layouts=tuple(options(planner, n, gpus_per_node) for n in range(job.max_gpus + 1)) if layouts else (),
    )


def run_jobs(args: argparse.Namespace, trace: Trace, replay: ReplayConfig) -> int:
    for flag in ("profile", "global_batch"):
        if getattr(args, flag) is not None:
            raise UserInputError(
                f"--jobs with --{flag.replace('_', '-')}: each job's profile and global batch come from the jobs "
                f"file; drop --{flag.replace('_', '-')}"
            )
    policies = parse_policies(args.policies)
    laid_out = args.layouts != "curve"
    jobs = read_jobs(Path(args.jobs), replay.gpus_per_node, laid_out)
    config = FleetConfig(replay=replay, layout_choice=args.layouts if laid_out else "liveput")
    report = simulate_jobs(jobs, trace, config, policies)
    if args.json:
        print(json.dumps({"policies": report}, indent=2))
        return 0
    print(f"{'policy':<18} {'deadlines met':>13} {'cost $':>10}  per job: finished hour (met?) $")
    for policy, row in report.items():
        assert isinstance(row, dict)
        cells = [
            f"{name} {_hour(o['finished_hour'])}{_met(o['met_deadline'])} {o['cost']:.0f}"
            for name, o in row["jobs"].items()
        ]
        print(f"{policy:<18} {row['deadlines_met']:>6}/{len(jobs):<6} {row['cost']:>10.2f}  {'; '.join(cells)}")
    return 0


def _hour(value: float | None) -> str:
    return "unfinished" if value is None else f"{value:.2f} h"


def _met(value: bool | None) -> str:
    return "" if value is None else (" (met)" if value else " (MISSED)")
