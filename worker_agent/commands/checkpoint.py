"""``spotmorph checkpoint verify DIR``, ``diff DIR_A DIR_B [--max-rel X] [--bitwise] [--json]`` and
``export DIR --hf OUT [--check [--tolerance X]]``.

DIR is a checkpoint root as ``train`` uses it (its newest valid checkpoint is meant) or one
``step-*`` checkpoint inside it. A damaged checkpoint (a bad file, or a manifest that is malformed or
names anything but its own layer files) is skipped with a warning in a root and exits 2 when named.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from morphing.errors import UserInputError

if TYPE_CHECKING:
    from worker_agent.runtime.storage.checkpoint import Checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    verify = sub.add_parser("verify", help="check manifests, sizes and checksums of a checkpoint")
    verify.add_argument("dir", type=Path, help="a checkpoint directory (its newest committed step)")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.add_argument(
        "--job-hash", help="refuse checkpoints of any other job, as resume does (a job_hash that verify prints)"
    )
    diff = sub.add_parser("diff", help="compare parameters and optimizer state of two checkpoints")
    diff.add_argument("dir_a", type=Path, help="the reference checkpoint directory")
    diff.add_argument("dir_b", type=Path, help="the checkpoint directory compared with it")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    diff.add_argument(
        "--max-rel",
        metavar="X",
        help="exit 1 when a tensor's relative difference (||a - b|| / ||a||) is above X, naming the worst",
    )
    diff.add_argument("--bitwise", action="store_true", help="exit 1 unless every tensor has the same dtype and bytes")
    export = sub.add_parser("export", help="write a checkpoint of a spotmorph.hf model as a save_pretrained dir")
    export.add_argument("dir", type=Path, help="the checkpoint directory to export (its newest committed step)")
    export.add_argument(
        "--hf",
        type=Path,
        required=True,
        metavar="OUT",
        help="a new directory for from_pretrained (with --check, an export to check)",
    )
    export.add_argument(
        "--config-from",
        metavar="MODEL_DIR_OR_ENTRYPOINT",
        help="the model's save_pretrained dir or the job's file.py:function (default: hf_config.json beside DIR)",
    )
    export.add_argument(
        "--check",
        action="store_true",
        help="load OUT with from_pretrained and compare its logits with the checkpoint's model (exit 1 if they "
        "differ); an OUT that is not empty is checked as it is, not written",
    )
    export.add_argument(
        "--tolerance",
        metavar="X",
        help="--check fails when the largest absolute logit difference is above X "
        "(default 1e-10 for a float64 checkpoint, 1e-4 otherwise)",
    )


def run(args: argparse.Namespace) -> int:
    if args.checkpoint_command == "verify":
        return _verify(args)
    if args.checkpoint_command == "export":
        return _export(args)
    return _diff(args)


def _verify(args: argparse.Namespace) -> int:
    from worker_agent.runtime.storage import checkpoint as ck

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    if args.job_hash is not None and not re.fullmatch(r"[0-9a-f]{64}", args.job_hash):
        raise UserInputError(f"--job-hash {args.job_hash!r}: use the 64 hex digits of a job_hash that verify prints")
    found = ck.resolve(args.dir, args.job_hash, warn=warn)
    manifest = found.manifest
    size = sum(f.size for f in manifest.files)
    if args.json:
        summary = {"path": str(found.path), "step": found.step, "files": len(manifest.files), "bytes": size}
        print(json.dumps({**summary, "job_hash": manifest.job_hash, "job": manifest.job.model_dump(exclude_none=True)}))
    else:
        print(f"{found.path}: valid, step {found.step}, {len(manifest.files)} files, {size} bytes")
        print(f"job: {manifest.describe_job(hash_digits=64)}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    """Exit 0 when the two checkpoints agree as asked, 1 when they do not (or are of different models or
    steps: no number makes those comparable), 2 on bad input."""
    from worker_agent.runtime.storage import checkpoint as ck

    bound = _max_rel(args.max_rel)
    a = ck.resolve(args.dir_a)
    b = ck.resolve(args.dir_b)
    result = ck.diff(a, b)
    compared, missing, worst = result["tensors_compared"], result["missing"], result["worst"]
    max_abs, max_rel = result["max_abs"], result["max_rel"]
    failures = []
    if a.step != b.step:
        failures.append(f"different steps ({a.step} vs {b.step}): compare checkpoints of the same step")
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        failures.append(f"different models: {len(missing)} tensors missing on one side or shaped otherwise ({shown})")
    if bound is not None and max_rel > bound:
        failures.append(f"max_rel {max_rel:.3e} > {bound:g}, worst {worst}")
    if args.bitwise and result["not_bitwise"]:
        differing = result["not_bitwise"]
        failures.append(f"not bitwise equal: {len(differing)} of {compared} tensors differ, first {differing[0]}")
    result["verdict"] = "differ" if failures else "agree"
    result["failures"] = failures
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{a.path} (step {a.step}) vs {b.path} (step {b.step}): {compared} tensors compared")
        print(f"max_abs {max_abs:.3e}  max_rel {max_rel:.3e}" + (f" ({worst})" if worst else ""))
        if not result["same_job"]:
            print("note: checkpoints of different jobs (entrypoint, batch, seed, dtype or exact mode differ)")
        for failure in failures:
            print(f"DIFFER: {failure}", file=sys.stderr)
        if args.bitwise and not failures:
            print("bitwise equal")
    return 1 if failures else 0


def _max_rel(text: str | None) -> float | None:
    return None if text is None else _bound("--max-rel", text)


def _export(args: argparse.Namespace) -> int:
    """Exit 0 when exported (and, with --check, the export computes the checkpoint's logits), 1 when the
    check fails, 2 on bad input."""
    from worker_agent.runtime.model.hf_export import export, read_config
    from worker_agent.runtime.storage import checkpoint as ck

    if args.tolerance is not None and not args.check:
        raise UserInputError("--tolerance bounds --check: add --check")
    tolerance = None if args.tolerance is None else _bound("--tolerance", args.tolerance)
    found = ck.resolve(args.dir)
    config = read_config(found, args.config_from)
    out: Path = args.hf
    if args.check and out.is_dir() and any(out.iterdir()):
        print(f"{out} is not empty: checking it as it is (nothing written)")
    else:
        names = export(found, config, out)
        print(f"{found.path} (step {found.step}): {len(names)} tensors -> {out} ({config.model_type})")
    return _check_export(found, config, out, tolerance) if args.check else 0


def _check_export(found: Checkpoint, config: Any, out: Path, tolerance: float | None) -> int:
    """Print the largest logit difference and PASS, or FAIL lines naming where it is; the exit code."""
    from worker_agent.runtime.model.hf_export_check import check_export, default_tolerance

    result = check_export(found, config, out)
    bound = default_tolerance(result.dtype) if tolerance is None else tolerance
    dtype = str(result.dtype).removeprefix("torch.")
    ids = "x".join(map(str, result.shape))
    print(f"check: {out} (from_pretrained) vs {found.path} (step {found.step}), {dtype} logits of {ids} token ids")
    print(f"max_abs {result.max_abs:.3e}  max_rel {result.max_rel:.3e}")
    failures = result.failures(bound)
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    if not failures:
        print(f"PASS: max_abs <= tolerance {bound:g}")
    return 1 if failures else 0


def _bound(option: str, text: str) -> float:
    try:
        bound = float(text)
    except ValueError:
        bound = math.nan
    if not 0 <= bound < math.inf:
        raise UserInputError(f"{option} {text!r}: give a finite number >= 0 (e.g. 1e-9)")
    return bound
