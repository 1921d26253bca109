"""The memory-morph bench's cases and its section of docs/benchmarks.md (:mod:`bench.memory_morph_bench`
runs them): the runs' figures, memory over disk, each model over the smallest, and where the pause went."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench.common import machine

HEADING = "## Planned morph through memory against the disk (`bench/memory_morph_bench.py`)"
BATCH, SEED, NOTICE, INTERVAL = 4, 3, 20, 1000
STEPS_BEFORE = 3  # steps of generation g after every warm trainer is ready, before the morph is set off
NEW_STEPS = 4  # steps of generation g+1 read for its step time, after the morph's checkpoint is committed
# VMs (= ranks) before and after; a case's kind is its name up to the first "-". The sizes (4 VMs to 3
# and back) are not the default: on 2 cores four trainers share the cores, and their pause says more about that.
CASES = {
    **{"growth": (1, 2), "eviction": (2, 1), "kill": (2, 1)},
    **{"growth-3-4": (3, 4), "eviction-4-3": (4, 3), "kill-4-3": (4, 3)},
}
DEFAULT_CASES = ("growth", "eviction", "kill")
# The global batch of a case that starts or ends on 4 VMs: one at which the planner wants all 4 (and 3 of 3),
# by the profiles in bench/profiles (`spotmorph plan --gpus 1-4 --global-batch B`).
WIDE_BATCH = {"4m": 24, "43m": 12, "120m": 12}
PATHS = {"memory": True, "disk": False}
PHASES = (
    *("checkpoint", "detect", "suspect", "salvage", "plan", "deliver"),
    *("process start", "rendezvous", "load", "first step"),
)
WHY = (
    "Why (the ranks' progress lines): through memory the stopping ranks keep their stage's tensors (no copy, "
    "nothing serialised) and g+1 runs on the same processes, on the model each built for g (*process start* near "
    "0 where every rank of g+1 is a holder); a layer a rank keeps is adopted as it is, a layer a peer lacks goes "
    "over gloo as its tensors' bytes with an XXH3-128 checksum, and g+1 writes the step after the held one in the "
    "background from the live tensors once its first step is done. On eviction the leaving rank hands off only "
    "what no survivor holds (here nothing), so the stop writes nothing; after a kill the survivor keeps its step "
    "(phase *salvage* 0). On growth the new VM's warm trainer built the job's model while the node was free and "
    "the growth waited for that build (the controller's hint and the heartbeat's *building*), and touched the "
    "memory the moves land in, so *process start* is near 0 there too and *load* runs at the speed of the "
    "bytes that move; a free or stopped node's heartbeat is held until its assignment is issued (*deliver* near "
    "0). Trainers keep the memory a step frees and a one-stage pipeline is told its tensors, so g+1's first step "
    "costs what its later ones do: *first step* is one step of g+1 (*idle* leaves it out). On a GPU node the "
    "write is from pinned host copies; not measured (no GPU). History (this machine, same command), growth "
    "memory / disk: with layers serialised by torch.save and copied at the stop 0.85 / 1.51 / 1.72 (4M / 43M / "
    "120M, 2026-11-26); raw-byte moves 0.48 / 0.91 / 1.34; adopting the moved tensors 0.76 / 0.86 / 1.26; the "
    "model reuse and the write from live tensors 0.45 / 0.50 (4M / 43M); XXH3 checksums 0.39 / 0.35 "
    "(2026-11-26); and on 2026-11-27 the growth's wait for the build, trainers that keep freed memory, a "
    "one-stage pipeline told its tensors, held heartbeats and touched memory, to the figures above."
)


@dataclass
class Run:
    size: str
    case: str
    path: str
    pause: float = 0.0  # TrainingResumed.pause_seconds
    steps_lost: int = 0  # the controller's count
    stop_write: float = 0.0  # the slowest rank's TrainingStopped.checkpoint_seconds
    step_seconds: float = 0.0  # median step of generation g
    new_step_seconds: float = 0.0  # median step of generation g+1 once the morph's checkpoint is committed
    stalled: float = math.nan  # TrainingResumed.stalled_seconds: of the pause, the time no rank could step
    resumed_from: str = ""  # memory, disk or mixed (g+1's `resumed` records)

    @property
    def idle(self) -> float:
        """The pause less one step of g+1: about the time no step ran (the pause ends with g+1's first step
        done, and that step may be slower than g+1's later ones: its first collectives, its allocations)."""
        return self.pause - self.new_step_seconds

    layouts: str = ""  # P x D of g -> of g+1, the planner's choice from the profile
    durable: float = 0.0  # the stop agreed -> that step's checkpoint committed
    phases: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    idles: list[float] = field(default_factory=list)  # every run's idle, where the case ran more than once


def median_runs(runs: Sequence[Run]) -> list[Run]:
    """One row per model, case and path: the run with the median idle (the lower of the two middle ones), so
    every figure of a row comes from one real run, with the idle of each run of it beside."""
    keys = dict.fromkeys((r.size, r.case, r.path) for r in runs)
    out = []
    for key in keys:
        same = sorted((r for r in runs if (r.size, r.case, r.path) == key), key=lambda r: r.idle)
        out.append(replace(same[(len(same) - 1) // 2], idles=[r.idle for r in same] if len(same) > 1 else []))
    return out


def batch(size: str, case: str) -> int:
    return WIDE_BATCH[size] if max(CASES[case]) > 2 else BATCH


def shape(status: dict[str, Any]) -> str:
    return f"{status['layout']['pipeline_stages']}x{status['layout']['data_parallel']}"


def ratio(runs: Sequence[Run], size: str, case: str, attr: str) -> str:
    by = {r.path: float(getattr(r, attr)) for r in runs if (r.size, r.case) == (size, case)}
    return f"{by['memory'] / by['disk']:.2f}" if by.get("disk", 0.0) >= 0.01 and "memory" in by else "-"  # not 0


def wide_batches(runs: Sequence[Run]) -> str:
    """The global batches of the runs on 4 VMs, for the section's header ("" when there are none)."""
    wide = {r.size: batch(r.size, r.case) for r in runs if batch(r.size, r.case) != BATCH}
    return f" ({', '.join(f'{s.upper()} {b}' for s, b in wide.items())} on 4 VMs)" if wide else ""


def over(value: float, base: float) -> float:
    return value / base if base > 0 else float("nan")


def by_size(runs: Sequence[Run]) -> list[str]:
    """Each larger model's pause, idle and stalled time over the smallest model's, same morph and path, same run."""
    sizes = list(dict.fromkeys(r.size for r in runs))
    if len(sizes) < 2:
        return []
    lines = ["", f"Over the {sizes[0].upper()} model's, same morph and path, same run:", ""]
    lines += ["| model | morph | path | pause | idle | stalled |", "|---|---|---|---:|---:|---:|"]
    base = {(r.case, r.path): r for r in runs if r.size == sizes[0]}
    for r in runs:
        if r.size != sizes[0] and (small := base.get((r.case, r.path))) is not None:
            pause, idle, stalled = (r.pause / small.pause, over(r.idle, small.idle), over(r.stalled, small.stalled))
            lines.append(f"| {r.size.upper()} | {r.case} | {r.path} | {pause:.2f} | {idle:.2f} | {stalled:.2f} |")
    return lines


def section(
    runs: Sequence[Run], sizes: dict[str, tuple[int, int]], command: str, load: tuple[float, ...], repeat: int = 1
) -> str:
    where = f"Machine: {machine()}; load average {load[0]:.2f} before, {load[1]:.2f} after."
    how = (
        f"{repeat} runs of each row, interleaved, each row the run with the median idle (the lower middle one) "
        "and every run's idle beside it"
        if repeat > 1
        else "one run, every row from it"
    )
    lines = [
        HEADING,
        "",
        "Toy run (`--quick`), not a measurement." if "--quick" in command else where,
        f"Command: `{command}`: {how}, one morph a row, on a fresh local cluster (1 slot a "
        f"VM); float32, global batch {BATCH}{wide_batches(runs)}, a checkpoint every {INTERVAL} steps (only the "
        "morph writes), the planner's profiles in bench/profiles (`spotmorph profile` on this machine at low load). "
        f"The 120M model was {'run' if '120m' in sizes else 'not run'}.",
        "",
        "| model | params | state MB | morph | path | step s | g+1 step s | pause s | idle s | stalled s "
        "| stop write s | resumed | lost | durable s |" + (" idle of each run s |" if repeat > 1 else ""),
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|" + ("---|" if repeat > 1 else ""),
    ]
    for r in runs:
        params, state = sizes[r.size]
        lines.append(
            f"| {r.size.upper()} | {params / 1e6:.1f}M | {state / 1e6:.0f} | {r.case} {r.layouts} | {r.path} | "
            f"{r.step_seconds:.2f} | {r.new_step_seconds:.2f} | {r.pause:.2f} | {r.idle:.2f} | {r.stalled:.2f} | "
            f"{r.stop_write:.2f} | "
            f"{r.resumed_from} | {r.steps_lost} | {r.durable:.2f} |"
            + (f" {', '.join(f'{i:.2f}' for i in r.idles)} |" if repeat > 1 else "")
        )
    if set(PATHS) <= {r.path for r in runs}:
        lines += ["", "Memory / disk, same run (the rows above):", ""]
        lines += ["| model | morph | pause | idle | stalled | stop write |", "|---|---|---:|---:|---:|---:|"]
        for size, case in dict.fromkeys((r.size, r.case) for r in runs):
            cells = " | ".join(ratio(runs, size, case, attr) for attr in ("pause", "idle", "stalled", "stop_write"))
            lines.append(f"| {size.upper()} | {case} | {cells} |")
    lines += by_size(runs)
    lines += ["", "Where the pause went (s; each phase ends when its slowest rank is done):", ""]
    lines += ["| model | morph | path | " + " | ".join(PHASES) + " |", "|---|---|---|" + "---:|" * len(PHASES)]
    for r in runs:
        cells = " | ".join(f"{r.phases.get(p, 0.0):.2f}" for p in PHASES)
        lines.append(f"| {r.size.upper()} | {r.case} | {r.path} | {cells} |")
    notes = [f"{r.size} {r.case} {r.path}: {n}" for r in runs for n in r.notes]
    lines += ["", "What the run's records say that was not expected:", "", *(f"- {n}" for n in notes)] if notes else []
    lines += [
        "",
        f"*g+1 step*: g+1's median step once the morph's checkpoint is committed (of {NEW_STEPS} steps, the "
        "background write over); *idle*: the pause less one step of g+1, about the time no step ran, since the "
        "pause ends with g+1's first step done; *stalled*: the controller's `TrainingResumed.stalled_seconds`, "
        "the pause to g+1's last rank beginning its first step (its state loaded), the time no rank could step; "
        "*state MB*: parameters and AdamW's two moments, 4 bytes each (the head's copy of the tied embedding "
        f"included); eviction: `local preempt NODE --notice {NOTICE}`; kill: `local kill NODE`; *stop write*: the "
        "slowest rank's `TrainingStopped.checkpoint_seconds` (after a kill, `SalvageWritten.seconds`), on the "
        "critical path (through memory: host copies of the stage, and the hand-off when a node leaves); *durable*: "
        "the stop (after a kill: the kill) to that step's `CheckpointCommitted` (through memory: written by g+1 in "
        "the background); phases: *checkpoint* the stop's write, *detect* to the survivor's `CollectiveFailed`, "
        "*suspect* to `NodesSuspected`, *salvage* to `SalvageEnded`, *plan* to `GenerationIssued`, *deliver* to "
        "the last rank given its assignment, *process start* to the last rank ready (model built), *load* to the "
        "last `resumed` line.",
        "",
        WHY,
    ]
    return "\n".join(lines)
