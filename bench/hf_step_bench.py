"""Hugging Face step time: the runtime (1 stage x 1 replica, default micro-batch) against a plain PyTorch loop.

Issue 14's user measured +10% (float64) and +30% (float32) for the runtime over a hand-written loop on a
small GPT-2, mostly from the old default that split 12 samples into 2 micro-batches on one device. Here,
in one run and on the same machine: a small GPT-2 (random init, dropout 0.1 as Hugging Face sets it) on
batches of 12 sequences of 64 tokens from the shipped byte-level corpus;

- the plain loop: ``GPT2LMHeadModel`` forward with labels (Hugging Face's token-mean loss), backward,
  ``clip_grad_norm_(1.0)``, AdamW step (the adapter's default optimizer), one thread;
- ``spotmorph train`` of the same model through :func:`spotmorph.hf.causal_lm_spec`, 1x1, with no
  ``--micro-batch-size`` (the default: one micro-batch of 12), and with ``--micro-batch-size 6`` (the
  old default, two micro-batches), each rank-0 ``step_seconds`` (all of a step: data, forward, backward,
  clip, optimizer, the per-step all-reduce of the stop flag and the loss).

On the CPU a trainer runs one thread (``torch.set_num_threads(1)``: P x D ranks share the machine), so
the plain loop does too. Figures are medians after a warm-up, as ratios to the plain loop.
``python bench/hf_step_bench.py [--steps N]`` prints the section and updates it in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, replace_section, spotmorph
from worker_agent.contract import GenerationDir, StepCompleted, events_of, read_progress

ENTRY = f"{Path(__file__).resolve()}:build"
BATCH, SEQ_LEN, OLD_MICRO = 12, 64, 6
HEADING = "## Hugging Face step time: the runtime against a plain PyTorch loop"


def hf_model() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=257, n_positions=SEQ_LEN, n_embd=128, n_layer=4, n_head=4, bos_token_id=256, eos_token_id=256
    )
    return GPT2LMHeadModel(config)


def dataset() -> Any:
    from spotmorph.data import TokenFileDataset

    return TokenFileDataset(ROOT / "examples" / "data" / "lighthouse.bin", seq_len=SEQ_LEN)


def build() -> Any:
    """The entrypoint ``spotmorph train`` runs: the same model and data through the adapter."""
    from spotmorph.hf import causal_lm_spec

    return causal_lm_spec(hf_model(), dataset())


def plain_loop(dtype: str, steps: int, warmup: int) -> list[float]:
    """Seconds per step of a hand-written loop over the same model, batch and optimizer."""
    import torch

    from spotmorph.hf import default_optimizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = hf_model().to(getattr(torch, dtype))
    model.train()
    optimizer = default_optimizer()(list(model.named_parameters()))
    data = dataset()
    times = []
    for step in range(steps):
        start = time.perf_counter()
        items = [data[(step * BATCH + i) % len(data)] for i in range(BATCH)]
        inputs = torch.stack([x for x, _ in items])
        labels = torch.stack([y for _, y in items])
        # the targets are aligned already (target t is the token after input t), so no shift: the mean
        # over predicted tokens, as Hugging Face's own loss and the adapter's token mode compute it
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times[warmup:]


def runtime_steps(dtype: str, steps: int, warmup: int, work: Path, micro: int | None) -> list[float]:
    """Rank-0 ``step_seconds`` of ``spotmorph train`` 1x1 (``micro``: None for the default)."""
    name = f"{dtype}-{micro or 'default'}"
    run_dir = work / f"run-{name}"
    cmd = spotmorph(
        "train",
        ENTRY,
        "--stages=1",
        "--replicas=1",
        f"--global-batch={BATCH}",
        f"--steps={steps}",
        f"--dtype={dtype}",
        "--device=cpu",
        "--checkpoint-interval=0",
        f"--checkpoint-dir={work / f'ckpt-{name}'}",
        f"--run-dir={run_dir}",
        *([f"--micro-batch-size={micro}"] if micro else []),
    )
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    records = read_progress(GenerationDir(run_dir).progress_file(0))
    return [e.step_seconds for e in events_of(records, StepCompleted) if e.step > warmup]


def section(steps: int, warmup: int) -> str:
    rows = [
        "| dtype | plain loop (ms/step) | runtime, default: 1 micro-batch of 12 (ms) | ratio "
        "| runtime, 2 micro-batches of 6 (old default) (ms) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="spotmorph-hf-bench-") as tmp:
        for dtype in ("float32", "float64"):
            # the plain loop before and after the runtime runs, so a slower machine phase hits both sides
            plain = plain_loop(dtype, steps, warmup)
            default = runtime_steps(dtype, steps, warmup, Path(tmp), None)
            old = runtime_steps(dtype, steps, warmup, Path(tmp), OLD_MICRO)
            plain += plain_loop(dtype, steps, warmup)
            rows.append(f"| {dtype} | {_cell(plain)} | {_cell(default)} | {_ratio(default, plain)} "
                        f"| {_cell(old)} | {_ratio(old, plain)} |")  # fmt: skip
    return "\n".join(
        [
            HEADING,
            "",
            f"`python bench/hf_step_bench.py --steps {steps}` on {machine()}; a small GPT-2 (4 layers, width 128,",
            f"random init, dropout 0.1), B={BATCH} sequences of {SEQ_LEN} tokens, one thread on each side; each",
            f"cell is the median (fastest) step after {warmup} warm-up steps, the plain loop run twice, before and",
            "after the runtime. Ratios are runtime / plain loop, of the medians (of the fastest steps, which other",
            "processes on a shared machine disturb least). The runtime's step includes the per-step all-reduce",
            "of the stop flag and the loss, and its layout-free dropout (keyed per sample, attention included).",
            "",
            *rows,
            "",
        ]
    )


def _cell(times: list[float]) -> str:
    return f"{statistics.median(times) * 1e3:.1f} ({min(times) * 1e3:.1f})"


def _ratio(runtime: list[float], plain: list[float]) -> str:
    return f"**{statistics.median(runtime) / statistics.median(plain):.2f}** ({min(runtime) / min(plain):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    parser.add_argument("--warmup", type=int, default=8, help="steps left out of each median (default 8)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    text = section(args.steps, args.warmup)
    print(text)
    if not args.no_write:
        replace_section(HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
