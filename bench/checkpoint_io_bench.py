"""Checkpoint I/O benchmark: the project's per-layer writer and reader against plain file I/O of the same bytes.

A GPT-2-shaped state (vocabulary 50257, 1024 positions, an embedding layer, 12 blocks and a final layer norm;
float32 parameters with Adam's two moments and its step), its width chosen so that the layer files hold
about ``--mb`` megabytes (default 490: about 41M parameters), is

- written by ``CheckpointWriter`` as one rank writes it (serialise, XXH3-128, fsync, rename, part
  file, manifest), and, as the raw baseline, the same layer files' bytes with plain open/write/fsync;
- read back as a controller's resume reads it (``committed``: the manifest checked, then ``load_tensors``:
  every file verified as it is loaded, once), as a standalone resume does (``resolve`` first verifies every
  file to pick a valid checkpoint, so each is read twice), and, as the raw baseline, with plain open/read:
  cold (every file dropped from the page cache first, ``posix_fadvise(DONTNEED)`` on each file, so both read
  the disk) and warm (from the page cache).

The project's and the raw runs alternate, ``--repeats`` times; each figure is a median, and each ratio is
project / raw of the same run. ``python bench/checkpoint_io_bench.py`` prints the section and updates it in
docs/benchmarks.md; ``--quick`` (about 20 MB, one repetition) only prints: no figure of it means anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, publish

HEADING = "## Checkpoint I/O against the raw disk (`bench/checkpoint_io_bench.py`)"
VOCAB = 50257
POSITIONS = 1024
BLOCKS = 12
BYTES_PER_PARAM = 12  # float32 parameter, exp_avg, exp_avg_sq
HISTORY = (
    "Until 2026-11-27 a controller's resume also read every file twice (rank 0 verified the committed "
    "checkpoint's files before any rank loaded them), as the standalone rows still do; the raw read hashes "
    "nothing. Until "
    "format v3 the checksum was SHA-256, about 1.1 GB/s per core here; XXH3-128 runs at about 10 GB/s per "
    "core. On 2026-11-26 (Intel Xeon, 2 cores), three runs in a row: v3, SHA-256 (commit 847d7d9), v3 again: "
    "write 1.60 / 1.73 / 1.42 of raw, cold read 0.77 / 0.49 / 0.59, warm read 0.48 / 0.23 / 0.48 (the table is "
    "the third run). History (2026-11-25, the Intel Xeon, "
    "four earlier pairs of runs of this bench, each pair the old code then the new): before layer files were "
    "streamed (torch.save into memory, then written; read whole into a bytearray, hashed, then torch.load "
    "copied it; one file at a time), write 0.47-0.67, cold read 0.13-0.21 and warm read 0.06-0.12 of raw; "
    "streamed, in the same pairs, 0.83-1.02, 0.22-0.29 and 0.09-0.28."
)
DEFAULT_MB = 490.0
QUICK_MB = 20.0


@dataclass(frozen=True)
class Figures:
    """Seconds of each run of each kind, and the bytes of the layer files."""

    size: int
    seconds: dict[str, list[float]]

    def rate(self, kind: str) -> float:
        return self.size / statistics.median(self.seconds[kind])


def block_shapes(width: int) -> dict[str, tuple[int, ...]]:
    d = width
    return {
        "ln1.weight": (d,),
        "ln1.bias": (d,),
        "qkv.weight": (3 * d, d),
        "qkv.bias": (3 * d,),
        "proj.weight": (d, d),
        "proj.bias": (d,),
        "ln2.weight": (d,),
        "ln2.bias": (d,),
        "fc.weight": (4 * d, d),
        "fc.bias": (4 * d,),
        "out.weight": (d, 4 * d),
        "out.bias": (d,),
    }


def layer_shapes(width: int) -> dict[str, dict[str, tuple[int, ...]]]:
    """Each layer's parameters: GPT-2's layout (the head is tied to the embedding, so it holds ln_f only)."""
    layers: dict[str, dict[str, tuple[int, ...]]] = {"embed": {"tok.weight": (VOCAB, width), "pos": (POSITIONS, width)}}
    layers.update({f"block{i}": block_shapes(width) for i in range(BLOCKS)})
    layers["head"] = {"ln_f.weight": (width,), "ln_f.bias": (width,)}
    return layers


def parameters(width: int) -> int:
    return sum(_numel(s) for shapes in layer_shapes(width).values() for s in shapes.values())


def width_for(megabytes: float) -> int:
    """The width (a multiple of 16) whose state is nearest ``megabytes``."""
    width = 16
    while parameters(width + 8) * BYTES_PER_PARAM <= megabytes * 1e6:
        width += 16
    return width


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def make_payloads(width: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    payloads: dict[str, Any] = {}
    for layer, shapes in layer_shapes(width).items():
        tensors = {f"{layer}.{name}": torch.randn(shape) for name, shape in shapes.items()}
        state = {
            name: {"step": torch.tensor(100.0), "exp_avg": torch.randn_like(t), "exp_avg_sq": torch.rand_like(t)}
            for name, t in tensors.items()
        }
        payloads[layer] = {"format": "spotmorph.layer/v1", "layer": layer, "tensors": tensors, "optimizer": state}
    return payloads


def manifest_for(layers: list[str]) -> dict[str, Any]:
    from morphing.jobspec import identity_hash
    from morphing.layout import make_layout

    identity = {"entrypoint": "bench", "global_batch": 1, "seed": 0, "dtype": "float32"}
    layout = make_layout(num_layers=len(layers), pipeline_stages=1, data_parallel=1, micro_batch_size=1, global_batch=1)
    return {
        "job_hash": identity_hash(identity),
        "job": identity,
        "data_cursor": {"samples_consumed": 1, "epoch": 0, "offset": 1},
        "layout": layout.to_dict(),
        "generation": 0,
        "layer_names": layers,
    }


def drop_from_page_cache(directory: Path) -> None:
    """Every file of ``directory`` (written and fsync'd, so clean) out of the page cache: the next read
    goes to the disk. Per file, so nothing else on the machine is touched."""
    for path in directory.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def raw_write(directory: Path, files: dict[str, bytes]) -> None:
    directory.mkdir()
    for name, data in files.items():
        with open(directory / name, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def raw_read(directory: Path, names: list[str]) -> None:
    for name in names:
        with open(directory / name, "rb") as fh:
            fh.read()


def measure(work: Path, megabytes: float, repeats: int) -> tuple[Figures, int]:
    from worker_agent.runtime.storage import checkpoint as ck

    width = width_for(megabytes)
    payloads = make_payloads(width)
    manifest = manifest_for(list(payloads))
    files = {f"{layer}.pt": ck.serialise(payload) for layer, payload in payloads.items()}
    size = sum(len(data) for data in files.values())
    names = {name for payload in payloads.values() for name in payload["tensors"]}
    kinds = ("write", "raw write", "cold", "raw cold", "warm", "raw warm", "cold twice", "warm twice")
    seconds: dict[str, list[float]] = {k: [] for k in kinds}

    def timed(kind: str, action: Callable[[], object]) -> None:
        start = time.perf_counter()
        action()
        seconds[kind].append(time.perf_counter() - start)

    def project_read(root: Path, choose: bool = False) -> None:
        found = ck.resolve(ck.step_dir(root, 1)) if choose else ck.committed(root, 1, 0, read_files=False)
        loaded = ck.load_tensors(found, names)
        assert len(loaded) == len(payloads)

    for rep in range(repeats):
        root, raw = work / f"project-{rep}", work / f"raw-{rep}"
        writer = ck.CheckpointWriter(root, 0, 1, "bench", keep=1, background=False, timeout=60)
        timed("write", partial(writer.save, 1, payloads, manifest))
        assert writer.bytes_written == size, (writer.bytes_written, size)
        timed("raw write", partial(raw_write, raw, files))
        drop_from_page_cache(ck.step_dir(root, 1))
        timed("cold", partial(project_read, root))
        drop_from_page_cache(raw)
        timed("raw cold", partial(raw_read, raw, list(files)))
        timed("warm", partial(project_read, root))
        timed("raw warm", partial(raw_read, raw, list(files)))
        drop_from_page_cache(ck.step_dir(root, 1))
        timed("cold twice", partial(project_read, root, choose=True))
        timed("warm twice", partial(project_read, root, choose=True))
        shutil.rmtree(root)
        shutil.rmtree(raw)
    return Figures(size, seconds), width


def section(figures: Figures, width: int, command: str, quick: bool, load: tuple[float, float]) -> str:
    import torch

    from worker_agent.runtime.storage import streams

    size = figures.size
    rows = [
        "| what | project MB/s | raw MB/s | project / raw | project / raw, each run |",
        "|---|---|---|---|---|",
    ]
    for label, kind in (
        ("write (serialise, XXH3-128, fsync, rename; part file, manifest)", "write"),
        ("read, cold, a controller's resume (the manifest, then each file verified as it loads)", "cold"),
        ("read, warm (the same, from the page cache)", "warm"),
        ("read, cold, a standalone resume (verify every file to choose, then verify again and load)", "cold twice"),
        ("read, warm, a standalone resume", "warm twice"),
    ):
        base = kind.removesuffix(" twice")
        ours, raw = figures.rate(kind), figures.rate(f"raw {base}")
        each = ", ".join(
            f"{r / o:.2f}" for o, r in zip(figures.seconds[kind], figures.seconds[f"raw {base}"], strict=True)
        )
        rows.append(f"| {label} | {ours / 1e6:.0f} | {raw / 1e6:.0f} | {ours / raw:.2f} | {each} |")
    gpu = "a GPU (not used here)" if torch.cuda.is_available() else "no GPU"
    return "\n".join(
        [
            HEADING,
            "",
            f"`{command}` on {machine()}, {gpu}"
            + (
                ": toy size, not a measurement."
                if quick
                else f"; 1-minute load average {load[0]:.1f} before and {load[1]:.1f} after the run (the cores "
                "are shared with other work, so the figures are noisy)."
            ),
            "",
            f"A GPT-2-shaped state (vocabulary {VOCAB}, {POSITIONS} positions, {BLOCKS} blocks, width {width}: "
            f"{parameters(width) / 1e6:.1f}M float32 parameters with Adam's two moments) in {BLOCKS + 2} layer "
            f"files, {size / 1e6:.0f} MB, in the temp directory. The raw baseline writes the same files' bytes with "
            "plain open/write/fsync and reads them with plain open/read, in the same run, alternating with the "
            f"project's runs; each figure is the median of {len(figures.seconds['write'])} and each ratio is "
            "project / raw. A cold read drops every file from the page cache first (`posix_fadvise(DONTNEED)` per "
            "file); the project's read is what a controller's resume does (`committed`: the manifest, then "
            "`load_tensors` checks each file as it loads it) and what a standalone one does (`resolve` first "
            "checks every file's checksum to choose a valid checkpoint). The raw baseline handles one file at a "
            "time, the project "
            f"up to {streams.WORKERS} at once (so its fsyncs overlap).",
            "",
            *rows,
            *([] if quick else ["", HISTORY]),
        ]
    )


def run(
    megabytes: float = DEFAULT_MB,
    repeats: int = 3,
    directory: Path | None = None,
    quick: bool = False,
    command: str = "python bench/checkpoint_io_bench.py",
) -> str:
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="checkpoint-io-bench-", dir=directory) as tmp:
        figures, width = measure(Path(tmp), megabytes, repeats)
    return section(figures, width, command, quick, (before, os.getloadavg()[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mb", type=float, default=None, help=f"size of the layer files (default {DEFAULT_MB:.0f})")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each kind (default 3; --quick: 1)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: the temp directory)")
    parser.add_argument("--quick", action="store_true", help=f"about {QUICK_MB:.0f} MB, once; print only")
    args = parser.parse_args(argv)
    megabytes = args.mb if args.mb is not None else (QUICK_MB if args.quick else DEFAULT_MB)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    command = " ".join(["python bench/checkpoint_io_bench.py", *(argv if argv is not None else sys.argv[1:])])
    result = run(megabytes, repeats, args.dir, quick=args.quick, command=command)
    publish(HEADING, result, not args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
