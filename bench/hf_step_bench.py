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
the plain loop does too. Both sides are measured in CPU time per step after a warm-up (robust on a machine
other processes share) and in wall time (median ``step_seconds``), as ratios to the plain loop.
``python bench/hf_step_bench.py [--steps N]`` prints the section and updates it in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, publish, spotmorph
from worker_agent.contract import GenerationDir, ProgressReader, StepCompleted, events_of, read_progress

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


@dataclass(frozen=True)
class Measured:
    wall: list[float]  # seconds per step after the warm-up
    cpu: float  # CPU seconds per step over the same steps (all the process's threads)


def plain_loop(dtype: str, steps: int, warmup: int) -> Measured:
    """A hand-written loop over the same model, batch and optimizer."""
    import torch

    from spotmorph.hf import default_optimizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = hf_model().to(getattr(torch, dtype))
    model.train()
    optimizer = default_optimizer()(list(model.named_parameters()))
    data = dataset()
    times, cpu_start = [], 0.0
    for step in range(steps):
        if step == warmup:
            cpu_start = time.process_time()
        start = time.perf_counter()
        items = [data[(step * BATCH + i) % len(data)] for i in range(BATCH)]
        inputs = torch.stack([x for x, _ in items])
        labels = torch.stack([y for _, y in items])
        # the targets are aligned already (target t is the token after input t), so no shift: the mean
        # over predicted tokens, as Hugging Face's own loss and the adapter's token mode compute it
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        times.append(time.perf_counter() - start)
    return Measured(times[warmup:], (time.process_time() - cpu_start) / (steps - warmup))


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``, every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runtime_steps(dtype: str, steps: int, warmup: int, work: Path, micro: int | None) -> Measured:
    """``spotmorph train`` 1x1 (``micro``: None for the default): rank 0's ``step_seconds``, and the
    trainer's CPU time read from /proc when its progress file shows step ``warmup`` and step ``last``."""
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
    last = steps - 1  # the step after it ends with the final checkpoint, which is no step's cost
    marks: dict[int, float] = {}
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as process:
        reader = ProgressReader(GenerationDir(run_dir).progress_file(0))
        while process.poll() is None and len(marks) < 2:
            for record in reader.poll():
                if isinstance(record.event, StepCompleted) and record.event.step in (warmup, last):
                    marks[record.event.step] = _cpu_seconds(record.pid)
            time.sleep(0.002)
        _, err = process.communicate()
    if process.returncode != 0 or len(marks) < 2:
        raise SystemExit(f"spotmorph train failed (exit {process.returncode}): {err.decode()[-2000:]}")
    records = read_progress(GenerationDir(run_dir).progress_file(0))
    wall = [e.step_seconds for e in events_of(records, StepCompleted) if warmup < e.step <= last]
    return Measured(wall, (marks[last] - marks[warmup]) / (last - warmup))


def section(steps: int, warmup: int) -> str:
    rows = [
        "| dtype | plain loop: CPU ms/step (wall median) | runtime, default: 1 micro-batch of 12 | ratio "
        "| runtime, 2 micro-batches of 6 (old default) | ratio |",
        "|---|---|---|---|---|---|",
    ]
    saved: list[str] = []
    with tempfile.TemporaryDirectory(prefix="spotmorph-hf-bench-") as tmp:
        for dtype in ("float32", "float64"):
            plain = plain_loop(dtype, steps, warmup)
            default = runtime_steps(dtype, steps, warmup, Path(tmp), None)
            old = runtime_steps(dtype, steps, warmup, Path(tmp), OLD_MICRO)
            rows.append(f"| {dtype} | {_cell(plain)} | {_cell(default)} | {_ratio(default, plain)} "
                        f"| {_cell(old)} | {_ratio(old, plain)} |")  # fmt: skip
            saved.append(f"{(old.cpu - default.cpu) / plain.cpu:+.2f} in {dtype}")
    return "\n".join(
        [
            HEADING,
            "",
            f"`python bench/hf_step_bench.py --steps {steps}` on {machine()}; a small GPT-2 (4 layers, width",
            f"128, random init, dropout 0.1), B={BATCH} sequences of {SEQ_LEN} tokens, one torch thread on each side,",
            f"after {warmup} warm-up steps. Each cell is CPU milliseconds per step (the process's user + system time,",
            "every thread; the runtime's from /proc at two step lines), then the median wall time per step in",
            "brackets. Ratios are runtime / plain loop of the CPU time (wall medians in brackets): the CPU time is",
            "what the code costs, the wall time also what other processes on a shared machine took from it. The",
            "runtime's step includes the per-step all-reduce of the stop flag and the loss (gloo threads",
            "included), and its layout-free dropout (keyed per sample, attention included).",
            "",
            *rows,
            "",
            f"One micro-batch instead of two saves, in plain-loop steps of CPU time: {', '.join(saved)}.",
            "",
        ]
    )


def _cell(m: Measured) -> str:
    return f"{m.cpu * 1e3:.1f} ({statistics.median(m.wall) * 1e3:.1f})"


def _ratio(runtime: Measured, plain: Measured) -> str:
    return f"**{runtime.cpu / plain.cpu:.2f}** ({statistics.median(runtime.wall) / statistics.median(plain.wall):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    parser.add_argument("--warmup", type=int, default=8, help="steps left out of each median (default 8)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    text = section(args.steps, args.warmup)
    publish(HEADING, text, not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
