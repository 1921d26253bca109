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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ReplayConfig()
    parser.add_argument("--trace", required=True, metavar="FILE", help="availability trace (3 formats, detected)")
    parser.add_argument("--profile", required=True, metavar="FILE", help="calibration profile (JSON)")
    parser.add_argument("--global-batch", type=int, required=True, metavar="B")
    parser.add_argument("--gpus-per-node", type=int, default=1, metavar="K")
    parser.add_argument("--morph-cost-seconds", type=float, default=defaults.morph_cost_seconds, metavar="C")
    parser.add_argument("--notice-seconds", type=float, default=defaults.notice_seconds)
    parser.add_argument(
        "--checkpoint-interval-seconds", type=float, default=defaults.checkpoint_interval_seconds, metavar="S"
    )
    parser.add_argument("--spot-price", type=float, default=defaults.spot_price_per_gpu_hour, help="$/GPU-hour")
    parser.add_argument("--on-demand-price", type=float, default=defaults.on_demand_price_per_gpu_hour)
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
    config = ReplayConfig(
        gpus_per_node=args.gpus_per_node,
        morph_cost_seconds=args.morph_cost_seconds,
        notice_seconds=args.notice_seconds,
        checkpoint_interval_seconds=args.checkpoint_interval_seconds,
        spot_price_per_gpu_hour=args.spot_price,
        on_demand_price_per_gpu_hour=args.on_demand_price,
    )
    report = simulate_policies(Planner(load_profile(args.profile), args.global_batch), trace, config)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    info = report["trace"]
    print(f"trace: {info['events']} events over {info['hours']:.1f} h ({info['shape']}), B = {args.global_batch}")
    print(f"{'policy':<24} {'goodput':>8} {'steps':>9} {'morphs':>7} {'lost':>8} {'GPU-h':>8} {'spot $':>9}")
    for name, row in report["policies"].items():
        print(
            f"{name:<24} {row['goodput_vs_oracle']:>8.1%} {row['steps']:>9.0f} {row['morphs']:>7} "
            f"{row['steps_lost']:>8.1f} {row['gpu_hours']:>8.1f} {row['cost_spot']:>9.2f}"
        )
    return 0
