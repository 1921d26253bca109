"""A real agent that waits for its own token, as the Azure and AWS token hand-over tests start it, and what they
read back from the controller: one source for both clouds' tests."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live


def start_agent(address: str, folder: Path, token_file: Path, *args: str) -> subprocess.Popen[str]:
    """``spotmorph agent`` with one CPU slot, no warm trainers, reading its token from ``token_file``."""
    command = [sys.executable, "-m", "spotmorph.cli", "agent", "--controller", address, "--slots", "1"]
    command += ["--gpus", "none", "--warm-trainers", "0", "--token-file", str(token_file)]
    command += ["--work-dir", str(folder), *args]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)


def nodes_of(live: Live) -> dict[str, pb.Node]:
    return {n.name: n for n in live.cluster().ListNodes(pb.ListNodesRequest()).nodes}


async def until(predicate: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        await asyncio.sleep(0.1)
