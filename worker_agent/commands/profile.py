"""``spotmorph profile ENTRYPOINT --micro-batch-sizes 1,2,4 --out profile.json``: calibrate a model.

What it is measuring (layer i of n, the micro-batch size, the time left) goes to stderr as it runs;
stdout only says where the profile was written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from morphing.jobspec import DEVICES, DTYPES, PRECISIONS


class _DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` names every default; a flag (off unless given) and an option with no default say none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = _DefaultsShown
    parser.add_argument("entrypoint", help="path/to/file.py:function or package.module:function")
    parser.add_argument("--micro-batch-sizes", default="1,2,4", help="comma-separated sizes to measure")
    parser.add_argument("--out", type=Path, required=True, help="where to write the profile JSON")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="parameter dtype")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="autocast precision, as the job's")
    parser.add_argument(
        "--device", choices=DEVICES, default="auto", help="auto: the GPU when there is one, else the CPU"
    )
    parser.add_argument("--device-index", type=int, default=None, help="which GPU (default: 0)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model's weights and the samples timed")
    parser.add_argument("--repeats", type=int, default=20, help="timed repetitions per measurement")
    parser.add_argument("--no-network", action="store_true", help="skip the loopback gloo measurements")
    parser.add_argument(
        "--from-config",
        action="store_true",
        help="for a model larger than this device: build it on the meta device (no weights in memory), take "
        "parameter memory from the shapes and time the layers one at a time, each made real only while timed",
    )


def run(args: argparse.Namespace) -> int:
    from worker_agent.runtime.process.allocator import keep_freed_memory
    from worker_agent.runtime.profiling.profiler import ProfileRequest, write_profile

    keep_freed_memory()  # layers are timed as the trainers run them

    sizes = _parse_sizes(args.micro_batch_sizes)
    if args.precision != "fp32" and args.dtype != "float32":
        from morphing.errors import UserInputError

        raise UserInputError(f"--precision {args.precision} runs over float32 masters; use --dtype float32")
    request = ProfileRequest(
        args.entrypoint,
        sizes,
        args.dtype,
        args.seed,
        args.repeats,
        not args.no_network,
        device=args.device,
        precision=args.precision,
        device_index=args.device_index,
        from_config=args.from_config,
    )
    write_profile(request, args.out, report=sys.stderr)
    print(f"wrote {args.out}")
    return 0


def _parse_sizes(text: str) -> tuple[int, ...]:
    from morphing.errors import UserInputError

    try:
        sizes = tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError as exc:
        raise UserInputError(f"--micro-batch-sizes {text!r}: use comma-separated integers like 1,2,4") from exc
    if not sizes or sizes[0] < 1:
        raise UserInputError(f"--micro-batch-sizes {text!r}: sizes must be >= 1")
    return sizes
