"""Where a command's CPU goes, by kind of process: ``python bench/suite_cpu.py -- pytest -q -n 2 tests``.

The test suite is bound by the CPU of a 2-core machine, and most of that CPU is spent by processes the tests
start (clusters' agents and trainers, ``spotmorph`` commands), which a profiler of the test process does not
see. This runs the command and reads every process's CPU time from ``/proc`` once a second; each process is
put in a kind by its command line (a forked process keeps its parent's: a warm trainer forked by the zygote
counts as the zygote, a forked rank as ``spotmorph train``). A process that lives less than a second between
two looks is missed, one first seen as a zombie counts as ``(exited)``. Prints the wall time and the CPU
seconds per kind, most first.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

KINDS = (
    "runtime.process.zygote",
    "runtime.process.warm",
    "runtime.process.trainer",
    "spotmorph.cli agent",
    "spotmorph.cli controller",
    "spotmorph.cli local",
    "spotmorph.cli train",
    "spotmorph.cli checkpoint",
    "spotmorph.cli submit",
    "spotmorph.cli",
    "pytest",
    "python",
)


def kind(command: str) -> str:
    return next((k for k in KINDS if k in command), command.split(" ", 1)[0].rsplit("/", 1)[-1] or "(exited)")


def look(seen: dict[tuple[int, int], tuple[str, float]], ticks: int) -> None:
    """Every process's CPU seconds so far, by (pid, start time)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1].split()
            key = (int(entry), int(fields[19]))
            if key not in seen:
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                seen[key] = (kind(command.strip()), 0.0)
            name, cpu = seen[key]
            seen[key] = (name, max(cpu, (int(fields[11]) + int(fields[12])) / ticks))
        except (OSError, IndexError, ValueError):
            continue


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        print("usage: python bench/suite_cpu.py -- COMMAND ...", file=sys.stderr)
        return 2
    ticks = os.sysconf("SC_CLK_TCK")
    started = time.monotonic()
    before = _keys()  # processes already running are not the command's
    process = subprocess.Popen(command)
    seen: dict[tuple[int, int], tuple[str, float]] = {}
    while process.poll() is None:
        look(seen, ticks)
        time.sleep(1.0)
    wall = time.monotonic() - started
    counts: collections.Counter[str] = collections.Counter()
    seconds: dict[str, float] = {}
    for key, (name, cpu) in seen.items():
        if key not in before:
            counts[name] += 1
            seconds[name] = seconds.get(name, 0.0) + cpu
    print(f"wall {wall:.0f} s, exit {process.returncode}; CPU seconds by kind of process:")
    for name, cpu in sorted(seconds.items(), key=lambda item: -item[1])[:20]:
        print(f"{cpu:9.1f} s {counts[name]:6d} processes  {name}")
    return process.returncode


def _keys() -> set[tuple[int, int]]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found.add((int(entry), int(Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1].split()[19])))
            except (OSError, IndexError, ValueError):
                continue
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
