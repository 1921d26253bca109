"""Runtime benchmark: measured step time against the simulator, and checkpoint I/O against the raw disk.

For every layout of the demo model with at most 4 processes, ``spotmorph train`` runs a few dozen steps;
the median step time of rank 0 (after warm-up) is compared with ``Planner.evaluate`` on a profile
calibrated in the same run. Checkpoint write and read throughput (serialise + checksum + fsync + rename,
and read + verify + load) are divided by the throughput of one plain fsync'd file of the same size.
``python bench/runtime_bench.py`` prints the section and updates it in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, median_step_seconds, publish, spotmorph

ENTRY = "examples/tiny_gpt.py:build"
GLOBAL_BATCH = 16
MICRO = 2
STEPS = 40
WARMUP = 10
LAYOUTS = ((1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2), (3, 1), (4, 1))
HEADING = "## Runtime: step time against the simulator, checkpoint I/O"


def measured_step_seconds(stages: int, replicas: int, work: Path) -> float:
    run_dir = work / f"run-{stages}x{replicas}"
    cmd = spotmorph(
        "train",
        ENTRY,
        f"--stages={stages}",
        f"--replicas={replicas}",
        f"--global-batch={GLOBAL_BATCH}",
        f"--micro-batch-size={MICRO}",
        f"--steps={STEPS}",
        f"--checkpoint-dir={work / f'ckpt-{stages}x{replicas}'}",
        f"--run-dir={run_dir}",
    )
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return median_step_seconds(run_dir, WARMUP)


def step_time_table(work: Path) -> tuple[list[str], list[float]]:
    from morphing.layout import make_layout
    from morphing.planner import Plan, Planner
    from morphing.profile import parse_profile
    from worker_agent.runtime.profiling.profiler import ProfileRequest, build_profile

    profile = parse_profile(json.dumps(build_profile(ProfileRequest(ENTRY, (1, 2, 4)))))
    planner = Planner(profile, GLOBAL_BATCH, "1f1b")
    rows = ["| layout (P x D) | processes | measured step (ms) | predicted (ms) | error |", "|---|---|---|---|---|"]
    errors = []
    for p, d in LAYOUTS:
        layout = make_layout(
            num_layers=len(profile.layers),
            pipeline_stages=p,
            data_parallel=d,
            micro_batch_size=MICRO,
            global_batch=GLOBAL_BATCH,
        )
        plan = planner.evaluate(layout)
        assert isinstance(plan, Plan), plan
        measured = measured_step_seconds(p, d, work)
        error = (plan.predicted_step_seconds - measured) / measured * 100
        errors.append(error)
        rows.append(
            f"| {p}x{d} | {p * d} | {measured * 1e3:.1f} | {plan.predicted_step_seconds * 1e3:.1f} | {error:+.0f}% |"
        )
    return rows, errors


def _raw_disk(path: Path, size: int) -> tuple[float, float]:
    """Bytes/s writing one fsync'd file of ``size`` bytes and reading it back."""
    data = os.urandom(size)
    start = time.perf_counter()
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    write = size / (time.perf_counter() - start)
    start = time.perf_counter()
    path.read_bytes()
    read = size / (time.perf_counter() - start)
    path.unlink()
    return write, read


def checkpoint_rows(work: Path) -> list[str]:
    import torch

    from morphing.jobspec import identity_hash
    from morphing.layout import make_layout
    from worker_agent.runtime.model.entrypoint import load_entrypoint
    from worker_agent.runtime.numerics.job import data_cursor
    from worker_agent.runtime.storage import checkpoint as ck

    build_config = load_entrypoint(f"{ROOT}/examples/tiny_gpt.py:build_config")

    rows = [
        "| model | checkpoint bytes | write MB/s | raw write MB/s | ratio | read MB/s | raw read MB/s | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, kwargs in (("demo (4x32)", {}), ("wider (8x256)", {"d_model": 256, "blocks": 8, "heads": 8})):
        torch.manual_seed(0)
        spec = build_config(**kwargs)
        payloads = {}
        for name, layer in spec.layers:
            tensors = {f"{name}.{p}": t.detach().clone() for p, t in layer.named_parameters()}
            state = {
                n: {"exp_avg": t.clone(), "exp_avg_sq": t.clone(), "step": torch.tensor(1.0)}
                for n, t in tensors.items()
            }
            payloads[name] = {"format": "spotmorph.layer/v1", "layer": name, "tensors": tensors, "optimizer": state}
        root = work / f"ckpt-io-{label.split()[0]}"
        writer = ck.CheckpointWriter(root, 0, 1, "bench", keep=3, background=False, timeout=60)
        start = time.perf_counter()
        identity = {"entrypoint": "bench", "global_batch": 1, "seed": 0, "dtype": "float32"}
        layout = make_layout(
            num_layers=len(spec.layers), pipeline_stages=1, data_parallel=1, micro_batch_size=1, global_batch=1
        )
        manifest = {
            "job_hash": identity_hash(identity),
            "job": identity,
            "data_cursor": data_cursor(1, 1, len(spec.dataset)),
            "layout": layout.to_dict(),
            "generation": 0,
            "layer_names": [name for name, _ in spec.layers],
        }
        writer.save(1, payloads, manifest)
        write_seconds = time.perf_counter() - start
        size = writer.bytes_written
        start = time.perf_counter()
        found = ck.resolve(root)
        ck.load_tensors(found, set(found.file_of_tensor()))
        read_seconds = time.perf_counter() - start
        raw_write, raw_read = _raw_disk(work / "raw.bin", size)
        w, r = size / write_seconds, size / read_seconds
        rows.append(
            f"| {label} | {size / 1e6:.1f} MB | {w / 1e6:.0f} | {raw_write / 1e6:.0f} | {w / raw_write:.2f} "
            f"| {r / 1e6:.0f} | {raw_read / 1e6:.0f} | {r / raw_read:.2f} |"
        )
    return rows


def run() -> str:
    with tempfile.TemporaryDirectory(prefix="runtime-bench-") as tmp:
        work = Path(tmp)
        step_rows, errors = step_time_table(work)
        io_rows = checkpoint_rows(work)
    mean_abs = statistics.mean(abs(e) for e in errors)
    cores = os.cpu_count() or 1
    fits = [abs(e) for (p, d), e in zip(LAYOUTS, errors, strict=True) if p * d <= cores]
    crowded = [abs(e) for (p, d), e in zip(LAYOUTS, errors, strict=True) if p * d > cores]
    fits_abs = statistics.mean(fits) if fits else float("nan")
    crowded_abs = statistics.mean(crowded) if crowded else float("nan")
    return "\n".join(
        [
            HEADING,
            "",
            f"Demo model `{ENTRY}`, B={GLOBAL_BATCH}, m={MICRO}, 1F1B, float32, gloo on loopback; "
            f"measured = median rank-0 step time of steps {WARMUP + 1}..{STEPS} of `spotmorph train`; "
            "predicted = `Planner.evaluate` (the schedule simulator) on a profile calibrated in the same "
            "run (`spotmorph profile`, sizes 1,2,4). Error = (predicted - measured) / measured. "
            f"Mean |error| {mean_abs:.0f}%.",
            "",
            *step_rows,
            "",
            f"Mean |error| with at most {cores} processes (one core each): {fits_abs:.0f}%; with more "
            f"processes than cores: {crowded_abs:.0f}%. Goal: 15%.",
            "",
            "How the prediction models this machine: the profiler records `compute_slots_per_node` = "
            f"{cores} (the cores), and the planner slows every stage's compute by processes / cores when a "
            "node runs more ranks than it has slots, since single-threaded ranks then time-share the cores. "
            "What the model still misses: (1) a stage waiting on gloo is not idle on a CPU, it spins and "
            "competes for a core, so crowded layouts run slower than the time-share estimate; (2) fixed "
            "per-step work the profile format has no field for (the optimizer step, gradient clipping, "
            "data loading, the stop/loss all-reduce); (3) per-micro-batch overhead of "
            "the pipeline schedule (Python scheduling, gloo p2p of small activations). Layer times "
            "are scaled so that their sum matches a chained forward + backward measured by the profiler "
            "(isolated layers run faster than chained ones). The machine is shared and noisy: the same "
            "layout varies between runs by tens of per cent.",
            "",
            "Checkpoint I/O: one rank writing every layer file (serialise, XXH3-128, fsync, rename, manifest) "
            "and reading it back (verify every checksum, load), against one plain fsync'd file of the same "
            "size written and read in the same run.",
            "",
            *io_rows,
            "",
            "For the small demo checkpoint the cost is per file (every layer file serialised, hashed, "
            "fsync'd and renamed, plus the part file and the manifest, each with a directory fsync), so its "
            "ratio is small; the wider model shows the rate on large files. Reading is bounded by checksum "
            "verification and unpickling, while the raw read comes from the page cache.",
        ]
    )


if __name__ == "__main__":
    result = run()
    publish(HEADING, result)
