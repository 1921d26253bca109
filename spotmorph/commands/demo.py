"""``spotmorph demo``: the main demo (for now, a planner what-if on the shipped GPT-style profile)."""

from __future__ import annotations

import argparse
from pathlib import Path

from spotmorph.commands import plan

PROFILE = Path(__file__).resolve().parents[2] / "examples" / "profiles" / "gpt48.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-gpus", type=int, default=64, help="largest GPU count of the what-if table")


def run(args: argparse.Namespace) -> int:
    print("spotmorph planner what-if: a 5.6 B-parameter GPT (48 blocks) on 16 GB V100s, 8 per node,")
    print(f"global batch 512, profile {PROFILE.relative_to(PROFILE.parents[2])}\n")
    table = argparse.Namespace(
        profile=str(PROFILE),
        gpus=f"1-{args.max_gpus}",
        gpus_per_node=8,
        global_batch=512,
        gpu_memory_gib=None,
        schedule="1f1b",
        json=False,
    )
    code = plan.run(table)
    print("\nThe same model on 37 GPUs, in detail:\n")
    plan.run(argparse.Namespace(**{**vars(table), "gpus": "37"}))
    return code
