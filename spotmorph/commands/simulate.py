"""``spotmorph simulate``: replay a spot-availability trace against spotmorph and the baselines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from morphing.errors import UserInputError
from morphing.planner import Planner
from morphing.replay import ReplayConfig, simulate_policies
from morphing.traces import parse_trace
from spotmorph.commands.plan import load_profile
from spotmorph.commands.simulate_jobs import run_jobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ReplayConfig()
    parser.add_argument("--trace", required=True, metavar="FILE", help="availability trace (3 formats, detected)")
    parser.add_argument("--profile", metavar="FILE", help="calibration profile (JSON); the one-job form")
    parser.add_argument("--global-batch", type=int, metavar="B", help="samples per optimizer step; the one-job form")
    parser.add_argument(
        "--jobs",
        metavar="JOBS.yaml",
        help="several jobs (name, profile, global_batch, steps, max_gpus, priority, deadline_hours, submit_hour) "
        "shared by the scheduler, on-demand GPUs at --on-demand-price; instead of --profile and --global-batch",
    )
    parser.add_argument(
        "--policies",
        metavar="P,Q",
        help="with --jobs: which of spotmorph, spot-only, on-demand-only, uniform-progress (default all)",
    )
    parser.add_argument(
        "--layouts",
        choices=("curve", "fastest", "liveput"),
        default="curve",
        help="with --jobs: each job runs at its throughput curve's speed (curve, the default), or runs a layout: "
        "the planner's fastest, or the one of best liveput at the trace's eviction rate as it is replayed; a VM "
        "lost then pauses the job for what the loss costs its layout (a morph, or a morph and a reload)",
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=1, metavar="K", help="GPUs per VM of the trace (default 1)"
    )
    parser.add_argument(
        "--morph-cost-seconds",
        type=float,
        default=defaults.morph_cost_seconds,
        metavar="C",
        help=f"seconds a morph stops training (default {defaults.morph_cost_seconds:g})",
    )
    parser.add_argument(
        "--notice-seconds",
        type=float,
        default=defaults.notice_seconds,
        help=f"eviction notice a VM gets (default {defaults.notice_seconds:g}; 0: none)",
    )
    parser.add_argument(
        "--checkpoint-interval-seconds",
        type=float,
        default=defaults.checkpoint_interval_seconds,
        metavar="S",
        help="seconds between checkpoints: what a VM lost without notice costs (the work since the last one)",
    )
    parser.add_argument("--spot-price", type=float, default=defaults.spot_price_per_gpu_hour, help="$/GPU-hour")
    parser.add_argument(
        "--on-demand-price",
        type=float,
        default=defaults.on_demand_price_per_gpu_hour,
        help="$/GPU-hour of a dedicated VM",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    for name in ("morph_cost_seconds", "notice_seconds", "spot_price", "on_demand_price"):
        if getattr(args, name) < 0:
            raise UserInputError(f"--{name.replace('_', '-')} {getattr(args, name)}: it must be >= 0")
    if args.checkpoint_interval_seconds <= 0:
        raise UserInputError(f"--checkpoint-interval-seconds {args.checkpoint_interval_seconds}: it must be > 0")
    if args.gpus_per_node <= 0:
        raise UserInputError(f"--gpus-per-node {args.gpus_per_node}: it must be >= 1")
    path = Path(args.trace)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"trace {path} cannot be read ({exc.__class__.__name__}); pass a trace file") from None
    trace = parse_trace(text, what=f"trace {path}")
    replay = ReplayConfig(
        gpus_per_node=args.gpus_per_node,
        morph_cost_seconds=args.morph_cost_seconds,
        notice_seconds=args.notice_seconds,
        checkpoint_interval_seconds=args.checkpoint_interval_seconds,
        spot_price_per_gpu_hour=args.spot_price,
        on_demand_price_per_gpu_hour=args.on_demand_price,
    )
    if args.jobs is not None:
        return run_jobs(args, trace, replay)
    if args.policies is not None:
        raise UserInputError("--policies goes with --jobs; the one-job form runs its own policies")
    if args.layouts != "curve":
        raise UserInputError(f"--layouts {args.layouts} goes with --jobs; the one-job form replays the planner's plans")
    if args.profile is None or args.global_batch is None:
        raise UserInputError("give --profile FILE and --global-batch B (one job), or --jobs JOBS.yaml (several)")
    report = simulate_policies(Planner(load_profile(args.profile), args.global_batch), trace, replay)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    info = report["trace"]
    print(f"trace: {info['events']} events over {info['hours']:.1f} h ({info['shape']}), B = {args.global_batch}")
    rows = report["policies"].values()
    spent = {f"{row['gpu_hours']:.1f} GPU-h, ${row['cost_spot']:.2f}" for row in rows}
    print(f"every policy holds the trace's spot VMs: {', '.join(sorted(spent))} at ${args.spot_price:g}/GPU-h")
    header = ("policy", "goodput", "steps", "morphs", "lost steps", "$/1k steps", "on-demand $")
    print(
        f"{header[0]:<24} {header[1]:>8} {header[2]:>9} {header[3]:>7} {header[4]:>11} {header[5]:>11} {header[6]:>12}"
    )
    for name, row in report["policies"].items():
        per_k = f"{1000 * row['cost_spot'] / row['steps']:>11.2f}" if row["steps"] else f"{'-':>11}"
        print(
            f"{name:<24} {row['goodput_vs_oracle']:>8.1%} {row['steps']:>9.0f} {row['morphs']:>7} "
            f"{row['steps_lost']:>11.1f} {per_k} {row['cost_on_demand_same_samples']:>12.2f}"
        )
    print(
        "lost steps: steps trained and redone after unplanned losses; $/1k steps: spot cost per 1,000 optimizer "
        f"steps; on-demand $: dedicated GPUs (${args.on_demand_price:g}/GPU-h) for the same steps"
    )
    return 0
