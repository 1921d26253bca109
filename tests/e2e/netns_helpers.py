"""What the ``--netns`` end-to-end tests share: the skip reason, TCP probes run inside a namespace,
listeners in a namespace, and the check that a cluster left no namespace or link behind."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.core.causes import MorphCause
from controller.eventlog.facts import GenerationIssued
from controller.eventlog.schema import Logged
from spotmorph.local import netns
from spotmorph.local.harness import LocalCluster
from spotmorph.local.network import NetworkPlan, prefix_of

REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"network namespaces cannot be made here: {REASON}")

# Connect to HOST PORT within TIMEOUT seconds; prints "connected" or the error's class name.
PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""
LISTEN = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen(16)
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""


def reaches(namespace: str | None, host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether a TCP connection from ``namespace`` (None: the root namespace) to ``host:port`` succeeds."""
    where = netns.exec_prefix(namespace) if namespace else []
    out = subprocess.run(
        [*where, sys.executable, "-c", PROBE, host, str(port), str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        check=True,
    )
    return out.stdout.strip() == "connected"


@contextlib.contextmanager
def listener(namespace: str, host: str, port: int) -> Iterator[None]:
    """A TCP server on ``host:port`` inside ``namespace`` for as long as the block runs."""
    process = subprocess.Popen(
        [*netns.exec_prefix(namespace), sys.executable, "-c", LISTEN, host, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "listening"
        yield
    finally:
        process.kill()
        process.wait()


def plan_of(cluster: LocalCluster) -> NetworkPlan:
    plan = netns.load_plan(cluster.files)
    assert plan is not None, "the cluster has no network.json: was it started with --netns?"
    return plan


def assert_nothing_left(cluster_root: Path) -> None:
    """No namespace and no link of the cluster whose directory is ``cluster_root`` exists."""
    namespaces, links = netns.leftovers(prefix_of(cluster_root))
    assert (namespaces, links) == ([], []), f"left behind: {namespaces + links}"


def unexplained(final: dict[str, Any], events: list[Logged[GenerationIssued]]) -> list[str]:
    """Generations without a GenerationIssued event naming a known cause: what the log leaves unexplained."""
    causes = {str(cause) for cause in MorphCause}
    issued = {e.fact.generation: e.fact for e in events}
    problems = [f"generation {g} has no GenerationIssued event" for g in range(1, int(final["generation"]) + 1)]
    problems = [p for g, p in enumerate(problems, 1) if g not in issued]
    problems += [f"generation {g}: unknown cause {f}" for g, f in issued.items() if f.morph_cause not in causes]
    return problems
