"""Shared helpers for benchmarks: timing real commands and describing the machine."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def time_command(args: Sequence[str], repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` runs of a real command (a fresh Python each time)."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, cwd=ROOT, check=True, capture_output=True)
        out.append(time.perf_counter() - start)
    return out


def median_step_seconds(run_dir: Path, warmup: int) -> float:
    """Rank 0's median ``step_seconds`` after step ``warmup`` of a ``spotmorph train --run-dir RUN_DIR`` run."""
    from worker_agent.contract import GenerationDir, StepCompleted, events_of, read_progress

    records = read_progress(GenerationDir(run_dir).progress_file(0))
    return float(statistics.median(e.step_seconds for e in events_of(records, StepCompleted) if e.step > warmup))


def spotmorph(*args: str) -> list[str]:
    return [sys.executable, "-m", "spotmorph.cli", *args]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def publish(heading: str, section: str, write: bool = True) -> None:
    """Print ``section`` and, when ``write``, put it in docs/benchmarks.md (:func:`replace_section`)."""
    print(section)
    if write:
        replace_section(heading, section)


def replace_section(heading: str, section: str) -> None:
    """Put ``section`` (which starts with ``heading``) in docs/benchmarks.md in place of the one there."""
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if heading in text:
        before, _, rest = text.partition(heading)
        after = rest[rest.find("\n## ") :] if "\n## " in rest else ""
        text = before + section + "\n" + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
