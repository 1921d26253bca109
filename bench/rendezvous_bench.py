"""A rank that reaches the generation's store before its host rank has started it: how long after the store
listens the rank is connected, with torch's own client (it backs off after a refused connect) against
:func:`worker_agent.runtime.process.trainer_setup.wait_listening` first (a connect every 10 ms), in the same run.

The host starts its store in a thread of the same process ``--delays`` seconds after the rank began to
connect (both modes alternate, ``--repeat`` times each); the figure is the time from the store's start to the
rank's connected client. ``python bench/rendezvous_bench.py`` prints the section and updates it in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.distributed as dist

from bench.common import machine, publish
from spotmorph.local.processes import free_port
from worker_agent.runtime.process.trainer_setup import wait_listening

HEADING = "## A rank that reaches the store before its host (`bench/rendezvous_bench.py`)"
MODES = ("torch's client", "wait_listening, then the client")
TCPStore = dist.TCPStore  # type: ignore[attr-defined]  # exported at runtime, not in the stubs


def connected_after_listening(delay: float, wait_first: bool) -> float:
    """Seconds from the host's store listening to this rank's client connected."""
    port, listening, stores = free_port(), [0.0], []

    def host() -> None:
        time.sleep(delay)
        listening[0] = time.perf_counter()
        stores.append(TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False))

    thread = threading.Thread(target=host)
    thread.start()
    if wait_first:
        wait_listening("127.0.0.1", port, time.monotonic() + 30)
    client = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30), wait_for_workers=False)
    done = time.perf_counter()
    thread.join()
    client.set("connected", "1")  # the client works against that host
    assert stores[0].get("connected") == b"1"
    return done - listening[0]


def section(results: dict[str, dict[float, list[float]]], repeat: int) -> str:
    delays = sorted(next(iter(results.values())))
    lines = [
        HEADING,
        "",
        f"Machine: {machine()}. Command: `python bench/rendezvous_bench.py --delays "
        f"{','.join(f'{d:g}' for d in delays)} --repeat {repeat}`: the host rank starts "
        "the store the given seconds after the other rank began to connect; seconds from the store listening to "
        f"the rank connected, median of {repeat} (min-max), both ways alternating in one run.",
        "",
        "| host late by s | " + " | ".join(MODES) + " |",
        "|---:|" + "---|" * len(MODES),
    ]
    for delay in delays:
        cells = [results[m][delay] for m in MODES]
        lines.append(
            f"| {delay:.2f} | "
            + " | ".join(f"{statistics.median(c):.3f} ({min(c):.3f}-{max(c):.3f})" for c in cells)
            + " |"
        )
    lines += [
        "",
        "Why: torch's TCPStore client retries a refused connect after a back-off that grows from a fraction of a "
        "second; a generation's ranks are told their assignments by their own agents, and the host rank (rank 0) "
        "is often told a moment after the others, so its store is up while they wait out the back-off. Every "
        "trainer's rendezvous (`worker_agent/runtime/process/trainer_setup.py`) now waits for the port first.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a rank's connect to a store started after it")
    parser.add_argument("--delays", default="0.02,0.1,0.3", help="comma-separated seconds the host is late by")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-docs", action="store_true", help="print only")
    args = parser.parse_args(argv)
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    if args.repeat < 1 or not delays or min(delays) < 0:
        parser.error("--repeat 1 or more, --delays zero or more seconds each")
    results: dict[str, dict[float, list[float]]] = {m: {d: [] for d in delays} for m in MODES}
    for _ in range(args.repeat):
        for delay in delays:
            for mode in MODES:
                results[mode][delay].append(connected_after_listening(delay, mode != MODES[0]))
    text = section(results, args.repeat)
    publish(HEADING, text, not args.no_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
