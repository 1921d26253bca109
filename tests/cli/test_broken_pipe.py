"""``spotmorph ... | head -1``: a reader that closes the pipe early ends the command quietly (exit 0, no
BrokenPipeError traceback); spotmorph.cli.main handles it once for every command."""

from __future__ import annotations

import fcntl
import io
import subprocess
import sys
from pathlib import Path

import pytest

from spotmorph.cli import main

ROOT = Path(__file__).resolve().parents[2]
GPT48 = str(ROOT / "examples" / "profiles" / "gpt48.json")
PAGE = 4096  # the smallest pipe Linux makes: the command's output must not fit in it, or it never sees the close

LONG_OUTPUTS = [
    ["plan", "--profile", GPT48, "--gpus", "1-300", "--gpus-per-node", "8", "--global-batch", "512"],
    ["plan", "--profile", GPT48, "--gpus", "1-100", "--gpus-per-node", "8", "--global-batch", "512", "--json"],
    ["submit", "--schema"],
]


@pytest.mark.slow
@pytest.mark.parametrize("args", LONG_OUTPUTS, ids=["plan table", "plan json", "submit schema"])
def test_a_pipe_closed_after_one_line_ends_quietly(args: list[str]) -> None:
    command = [sys.executable, "-m", "spotmorph.cli", *args]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, bufsize=0)
    assert child.stdout is not None and child.stderr is not None
    fcntl.fcntl(child.stdout.fileno(), fcntl.F_SETPIPE_SZ, PAGE)
    first = child.stdout.readline()  # unbuffered: one line read, the rest left in the pipe
    child.stdout.close()  # as `head -1` exits
    try:
        err = child.stderr.read().decode()
        code = child.wait(timeout=120)
    finally:
        child.kill()
    assert first.strip(), err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err, err
    assert code == 0, err


class ClosedPipe(io.StringIO):
    """A stdout whose reader has gone, and with no descriptor of its own (the redirect is left alone)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")


def test_in_process_a_closed_pipe_is_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["plan", "--profile", GPT48, "--gpus", "1-3", "--global-batch", "64"]) == 0
    with pytest.raises(SystemExit) as help_exit:  # argparse's own output, before any command runs
        main(["--help"])
    assert help_exit.value.code == 0
