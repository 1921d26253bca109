"""This pytest worker's end of its fork server (tests/forkserver.py): started on first use, one per worker."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_server: subprocess.Popen[bytes] | None = None
_one_at_a_time = threading.Lock()
ROOT = Path(__file__).resolve().parents[1]


def enabled() -> bool:
    """Whether commands go through the fork server (``SPOTMORPH_TEST_FORKSERVER=0``: every one a new process)."""
    return os.environ.get("SPOTMORPH_TEST_FORKSERVER") != "0"


def _started() -> subprocess.Popen[bytes]:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            bufsize=0,
        )
    return _server


def _reply(server: subprocess.Popen[bytes], deadline: float | None) -> dict[str, Any] | None:
    """The server's next line; None at ``deadline``."""
    assert server.stdout is not None
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        if select.select([server.stdout], [], [], left)[0]:
            line = server.stdout.readline()
            if not line:
                raise RuntimeError(f"the fork server exited {server.wait()}")
            found: dict[str, Any] = json.loads(line)
            return found


def run(argv: Sequence[str], cwd: Path, timeout: float, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """``python ARGV`` (``-m MODULE ...``) forked from the server, with ``env`` (this process's by default): exit
    code, stdout, stderr. Past ``timeout`` the command is killed and :class:`subprocess.TimeoutExpired` raised, as
    :func:`subprocess.run` does. One command at a time (the server waits for each)."""
    with _one_at_a_time:
        return _run(list(argv), cwd, timeout, dict(os.environ if env is None else env))


def _run(argv: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> tuple[int, str, str]:
    server = _started()
    assert server.stdin is not None
    with tempfile.TemporaryDirectory(prefix="forked-") as folder:
        out, err = Path(folder, "out"), Path(folder, "err")
        request = {"argv": argv, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
        server.stdin.write((json.dumps(request) + "\n").encode())
        server.stdin.flush()
        forked = _reply(server, time.monotonic() + 120)
        if forked is None:
            raise RuntimeError("the fork server did not fork within 120 s")
        done = _reply(server, time.monotonic() + timeout)
        if done is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(forked["pid"]), signal.SIGKILL)
            _reply(server, None)
            raise subprocess.TimeoutExpired(["python", *argv], timeout)
        return int(done["exit"]), out.read_text(errors="replace"), err.read_text(errors="replace")


def zygote(folder: Path, parent: int) -> tuple[int, int, int]:
    """A node's zygote forked from the server, serving ``parent`` (this process, a child subreaper by now, which
    adopts it): its pid, and the write end of its requests and the read end of its answers (named FIFOs in
    ``folder``), as :class:`worker_agent.agent.zygote.InheritedProcess` takes them."""
    requests, answers = folder / "zygote-requests", folder / "zygote-answers"
    for fifo in (requests, answers):
        os.mkfifo(fifo, 0o600)
    with _one_at_a_time:
        server = _started()
        assert server.stdin is not None
        order = {"requests": str(requests), "answers": str(answers), "parent": parent}
        server.stdin.write((json.dumps({"zygote": order}) + "\n").encode())
        server.stdin.flush()
        forked, done = _reply(server, time.monotonic() + 120), _reply(server, time.monotonic() + 120)
    if forked is None or done is None or done["exit"] != 0:
        raise RuntimeError(f"the fork server forked no zygote: {forked}, {done}")
    from_zygote = os.open(answers, os.O_RDONLY | os.O_NONBLOCK)  # the zygote opens its end of it first
    deadline = time.monotonic() + 60
    while True:
        try:
            to_zygote = os.open(requests, os.O_WRONLY | os.O_NONBLOCK)  # once the zygote has opened both
            break
        except OSError:  # ENXIO: not yet
            if time.monotonic() > deadline:
                raise RuntimeError("the forked zygote never opened its requests") from None
            time.sleep(0.005)
    os.set_blocking(to_zygote, True)
    for fifo in (requests, answers):
        fifo.unlink()
    return int(forked["pid"]), to_zygote, from_zygote
