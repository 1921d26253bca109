"""``spotmorph checkpoint verify DIR`` and ``spotmorph checkpoint diff DIR_A DIR_B [--json]``.

DIR is a checkpoint root as ``train`` uses it (its newest valid checkpoint is meant) or one
``step-*`` checkpoint inside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    verify = sub.add_parser("verify", help="check manifests, sizes and SHA-256 of a checkpoint")
    verify.add_argument("dir", type=Path)
    verify.add_argument("--json", action="store_true")
    diff = sub.add_parser("diff", help="compare parameters and optimizer state of two checkpoints")
    diff.add_argument("dir_a", type=Path)
    diff.add_argument("dir_b", type=Path)
    diff.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.checkpoint_command == "verify":
        return _verify(args)
    return _diff(args)


def _verify(args: argparse.Namespace) -> int:
    from worker_agent.runtime import checkpoint as ck

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    found = ck.resolve(args.dir, warn=warn)
    files = found.manifest["files"]
    size = sum(int(f["bytes"]) for f in files)
    if args.json:
        print(json.dumps({"path": str(found.path), "step": found.step, "files": len(files), "bytes": size}))
    else:
        print(f"{found.path}: valid, step {found.step}, {len(files)} files, {size} bytes")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from worker_agent.runtime import checkpoint as ck

    a = ck.resolve(args.dir_a)
    b = ck.resolve(args.dir_b)
    result = ck.diff(a, b)
    compared, missing, worst = result["tensors_compared"], result["missing"], result["worst"]
    max_abs, max_rel = result["max_abs"], result["max_rel"]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{a.path} (step {a.step}) vs {b.path} (step {b.step}): {compared} tensors compared")
        print(f"max_abs {max_abs:.3e}  max_rel {max_rel:.3e}" + (f" ({worst})" if worst else ""))
        if missing:
            print(f"missing on one side: {', '.join(missing)}")
    return 0
