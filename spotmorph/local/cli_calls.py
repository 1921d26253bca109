"""Running ``spotmorph`` commands for the harness: as a new process, or, for the read-only questions it polls
(``status``, ``nodes``, ``events``), inside this one.

A poll is a question asked every fraction of a second for minutes. As a process, each costs an interpreter
start and the client's imports (0.8 s of CPU on a 2-core AMD EPYC, measured): a test waiting on a status
spent most of a core on asking, taken from the cluster it waited for. In this process the same command
(its parser, its gRPC call, its JSON) answers in milliseconds; the controller, the address and the token
are the cluster's own, named on the command line, so nothing in this process's environment is read.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class CommandFailed(RuntimeError):
    """A ``spotmorph`` command exited non-zero; the message has its stdout and stderr."""


def spotmorph(*args: str) -> list[str]:
    """The command line of ``spotmorph ARGS`` with this Python."""
    return [sys.executable, "-m", "spotmorph.cli", *args]


def _checked(
    args: Sequence[str], out: subprocess.CompletedProcess[str], check: bool
) -> subprocess.CompletedProcess[str]:
    if check and out.returncode != 0:
        raise CommandFailed(f"spotmorph {' '.join(args)} exited {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out


# ``python -m spotmorph.cli ARGS`` run elsewhere than in a new interpreter: (argv after the interpreter, the
# environment, the timeout) -> (exit code, stdout, stderr), raising subprocess.TimeoutExpired past the timeout.
Runner = Callable[[Sequence[str], Mapping[str, str], float], tuple[int, str, str]]
# The runner of this context (a thread started since sees none, and runs its commands as new processes).
_RUNNER: contextvars.ContextVar[Runner | None] = contextvars.ContextVar("spotmorph_cli_runner", default=None)


def use_runner(runner: Runner | None) -> Runner | None:
    """Run every command of :func:`run_cli` with ``runner`` (None: as new processes again); returns the one it
    replaces. The test suite forks them from a server that imported once (tests/forkserver.py): a command's
    imports cost 0.6-5 s of CPU."""
    before = _RUNNER.get()
    _RUNNER.set(runner)
    return before


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``spotmorph ARGS`` as a new process (with ``env``, from the repository's root), or with the runner set."""
    command = spotmorph(*args)
    runner = _RUNNER.get()
    if runner is not None:
        code, stdout, stderr = runner(command[1:], os.environ if env is None else env, timeout)
        return _checked(args, subprocess.CompletedProcess(command, code, stdout, stderr), check)
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        cwd=ROOT,
        timeout=timeout,
    )
    return _checked(args, out, check)


def ask(args: Sequence[str], controller: str, token: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``spotmorph ARGS --controller CONTROLLER --token TOKEN`` in this process: a client command's exit code,
    stdout and stderr exactly as the process would give them."""
    from spotmorph.cli import main

    command = [*args, "--controller", controller, *([f"--token={token}"] if token else [])]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(command)
        except SystemExit as exc:  # argparse's usage errors, as the process would exit
            code = exc.code if isinstance(exc.code, int) else 1
    out = subprocess.CompletedProcess(["spotmorph", *command], code, stdout.getvalue(), stderr.getvalue())
    return _checked(args, out, check)
