"""``spotmorph plan``: the planner as a what-if tool ("what would 37 GPUs give me?")."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from morphing.errors import UserInputError
from morphing.jobspec import SCHEDULES
from morphing.planner import Plan, Planner, PlanResult
from morphing.profile import Profile, parse_profile
from morphing.stages import GIB
from morphing.validation import shown
from morphing.words import plural

EXIT_NO_FIT = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, metavar="FILE", help="calibration profile (JSON)")
    parser.add_argument("--gpus", required=True, metavar="N|A-B", help="GPU count, or a range for a what-if table")
    parser.add_argument("--gpus-per-node", type=int, default=1, metavar="K", help="GPUs per node (default 1)")
    parser.add_argument("--global-batch", type=int, required=True, metavar="B", help="samples per optimizer step")
    parser.add_argument("--gpu-memory-gib", type=float, metavar="X", help="override the profile's GPU memory")
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule (default 1f1b)")
    parser.add_argument(
        "--activation-recomputation",
        action="store_true",
        help="plan as a job with activation_recomputation: less activation memory, a forward more per backward",
    )
    parser.add_argument(
        "--compute-slots-per-node",
        metavar="N|none",
        help="override the profile's compute_slots_per_node (ranks a node runs at full speed; a CPU profile "
        "sets its cores); none: every rank has a device of its own, as GPUs (default: the profile's)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def parse_gpus(text: str) -> tuple[int, int]:
    """``"N"`` or ``"A-B"`` as an inclusive range; bad text is a :class:`UserInputError`."""
    text = text.strip()
    if text.startswith("-") and text[1:].isdigit():
        raise UserInputError(f"--gpus {text!r}: the GPU count must be >= 1")
    parts = text.split("-")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2 and parts[0]:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError(text)
    except ValueError:
        raise UserInputError(f"--gpus {text!r}: give a count like 8 or a range like 1-64") from None
    if low <= 0:
        raise UserInputError(f"--gpus {text!r}: the GPU count must be >= 1")
    if high < low:
        raise UserInputError(f"--gpus {text!r}: the range must go up, e.g. {high}-{low}")
    return low, high


def load_profile(path: str) -> Profile:
    file = Path(path)
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise UserInputError(
            f"profile {path} not found; measure one with `spotmorph profile` or try examples/profiles/gpt48.json"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise UserInputError(f"profile {path} cannot be read ({exc.__class__.__name__}); pass a JSON file") from None
    return parse_profile(text, what=f"profile {path}")


def run(args: argparse.Namespace) -> int:
    low, high = parse_gpus(args.gpus)
    if args.gpus_per_node <= 0:
        raise UserInputError(f"--gpus-per-node {args.gpus_per_node}: it must be >= 1")
    memory = None
    if args.gpu_memory_gib is not None:
        if not args.gpu_memory_gib > 0:
            raise UserInputError(f"--gpu-memory-gib {args.gpu_memory_gib}: it must be > 0")
        memory = int(args.gpu_memory_gib * GIB)
    profile = with_slots(load_profile(args.profile), args.compute_slots_per_node)
    slots = slots_line(profile, min(args.gpus_per_node, high))  # the most ranks one node may run
    if slots and args.json:
        print(slots, file=sys.stderr)  # stdout stays JSON
    planner = Planner(profile, args.global_batch, args.schedule, memory, args.activation_recomputation)
    if low == high:
        result = planner.plan_gpus(low, args.gpus_per_node)
        _print_single(result, args.json)
        if not args.json:
            print(*([slots] if slots else []), network_line(profile), sep="\n")
        return 0 if result.feasible else EXIT_NO_FIT
    results = planner.what_if(high, args.gpus_per_node)[low - 1 :]
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        _print_table(results)
        print(*([slots] if slots else []), network_line(profile), sep="\n")
    return 0 if any(r.feasible for r in results) else EXIT_NO_FIT


def with_slots(profile: Profile, text: str | None) -> Profile:
    """``profile`` with ``--compute-slots-per-node`` (a count, or ``none``) in place of its own."""
    if text is None:
        return profile
    value: int | None = None
    if text.strip().lower() != "none":
        try:
            value = int(text, 10)
        except ValueError:
            value = 0
        if value < 1:
            raise UserInputError(
                f"--compute-slots-per-node {text!r}: give a count >= 1, or none (a device per rank, as GPUs)"
            )
    cluster = profile.cluster.model_copy(update={"compute_slots_per_node": value})
    return profile.model_copy(update={"cluster": cluster})


def slots_line(profile: Profile, ranks_per_node: int) -> str | None:
    """Says so when the profile's compute slots slow this plan down: a CPU profile's cores, applied to a node
    of more GPUs, make every stage's compute ranks / slots times slower, which looks like a bad planner."""
    slots = profile.cluster.compute_slots_per_node
    if slots is None or ranks_per_node <= slots:
        return None
    return (
        f"compute slots       the profile's compute_slots_per_node={slots} was applied: a node runs {slots} "
        f"rank(s) at full speed and more share it ({ranks_per_node} on a node: each {ranks_per_node / slots:.3g}x "
        "slower), as a CPU calibration's cores; for GPUs (a device per rank) pass --compute-slots-per-node none "
        "or profile on a GPU"
    )


def network_line(profile: Profile) -> str:
    """The network figures the plan rests on and where they come from: a profile copied from elsewhere
    carries that cluster's network, which only a profile measured on this one replaces."""
    cluster = profile.cluster
    figures = (
        f"{cluster.inter_node_bandwidth_bytes_per_second / 1e9:.2f} GB/s between nodes, all-reduce "
        f"{cluster.allreduce_bandwidth_bytes_per_second / 1e9:.2f} GB/s"
    )
    source = shown(profile.source, 120) if profile.source else "the profile does not say where they come from"
    return f"network             {figures} (the profile's: {source})"


def _print_single(result: PlanResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
        return
    if not isinstance(result, Plan):
        print(f"no layout fits {result.gpus} GPU(s): {result.reason}", file=sys.stderr)
        return
    layout = result.layout
    print(f"GPUs                {result.gpus} ({result.gpus_used} used)")
    print(f"layout              {plural(layout.pipeline_stages, 'stage')} x {plural(layout.data_parallel, 'replica')}")
    print(f"micro-batch size    {layout.micro_batch_size}  ({result.schedule})")
    print(f"micro-batches       {_runs(layout.micro_batches_per_replica)} per replica")
    print(f"samples/replica     {_runs(layout.samples_per_replica)} (sum {layout.global_batch})")
    print(f"stage layers        {' '.join(f'[{a},{b})' for a, b in layout.stage_layers)}")
    print(f"peak stage memory   {max(m.total for m in result.stage_memory) / GIB:.2f} GiB")
    print(f"step time           {result.predicted_step_seconds:.4f} s (bubble {result.bubble_fraction:.1%})")
    print(f"throughput          {result.samples_per_second:.2f} samples/s")
    for note in result.notes:
        print(f"note                {note}")


def _print_table(results: list[PlanResult]) -> None:
    print(f"{'gpus':>5} {'used':>5} {'P':>3} {'D':>4} {'m':>3} {'M':>5} {'step s':>10} {'samples/s':>11}  note")
    for r in results:
        if isinstance(r, Plan):
            lay = r.layout
            print(
                f"{r.gpus:>5} {r.gpus_used:>5} {lay.pipeline_stages:>3} {lay.data_parallel:>4} "
                f"{lay.micro_batch_size:>3} {lay.max_micro_batches:>5} {r.predicted_step_seconds:>10.4f} "
                f"{r.samples_per_second:>11.2f}"
            )
        else:
            print(f"{r.gpus:>5} {'-':>5} {'-':>3} {'-':>4} {'-':>3} {'-':>5} {'-':>10} {'-':>11}  {r.reason}")


def _runs(values: tuple[int, ...]) -> str:
    """``(3, 3, 2)`` as ``3 x2, 2 x1``: long lists stay readable."""
    out: list[str] = []
    for value in dict.fromkeys(values):
        out.append(f"{value} x{values.count(value)}")
    return ", ".join(out)
