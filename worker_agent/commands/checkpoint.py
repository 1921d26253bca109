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
    import torch

    from worker_agent.runtime import checkpoint as ck

    a = ck.resolve(args.dir_a)
    b = ck.resolve(args.dir_b)
    ta, tb = ck.read_all(a), ck.read_all(b)
    missing = sorted(set(ta) ^ set(tb))
    max_abs = max_rel = 0.0
    compared = 0
    worst = ""
    for name in sorted(set(ta) & set(tb)):
        x, y = ta[name].double(), tb[name].double()
        if x.shape != y.shape:
            missing.append(f"{name} (shape {list(x.shape)} vs {list(y.shape)})")
            continue
        compared += 1
        diff = (x - y).abs()
        abs_err = float(diff.max()) if diff.numel() else 0.0
        norm = float(torch.linalg.vector_norm(x))
        dnorm = float(torch.linalg.vector_norm(x - y))
        rel = dnorm / norm if norm > 0 else (0.0 if dnorm == 0 else float("inf"))
        max_abs = max(max_abs, abs_err)
        if rel > max_rel:
            max_rel, worst = rel, name
    result = {
        "step_a": a.step,
        "step_b": b.step,
        "max_abs": max_abs,
        "max_rel": max_rel,
        "tensors_compared": compared,
        "missing": missing,
        "worst": worst,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{a.path} (step {a.step}) vs {b.path} (step {b.step}): {compared} tensors compared")
        print(f"max_abs {max_abs:.3e}  max_rel {max_rel:.3e}" + (f" ({worst})" if worst else ""))
        if missing:
            print(f"missing on one side: {', '.join(missing)}")
    return 0
