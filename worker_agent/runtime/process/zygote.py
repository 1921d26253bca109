"""A node's zygote: one process that imports what a trainer imports once, then forks each warm trainer.

A warm trainer's imports (torch, the runtime, the model libraries) cost 3-8 s of CPU each on a 2-core VM,
paid again for every warm trainer the agent keeps and for every one it starts to replace one a morph used:
on the same cores as the training. The zygote pays them once per agent; each warm trainer is then a fork
that shares their pages copy-on-write.

``python -m worker_agent.runtime.process.zygote --spool=DIR --parent=AGENT_PID``, with pipes on stdin and stdout
(:mod:`worker_agent.agent.zygote` is the other end): the agent writes one JSON line per warm trainer it wants
(``{"spool": PATH}``); the zygote answers each, once its imports are done, with ``{"spool": PATH, "pid": N}``
(or ``"error"``). It forks twice, so the warm trainer is an orphan adopted by the agent, a child subreaper:
the agent waits for it and reads its exit code as for a process it started itself. The warm trainer gets a
process group of its own and its spool's log, as a warm trainer the agent starts does, and runs
:func:`worker_agent.runtime.process.warm.main`. Only for CPU nodes (as :mod:`worker_agent.runtime.process.forked`). The
zygote ends when its stdin closes: the agent is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from worker_agent.contract import WarmSpool
from worker_agent.runtime.link.spool import append_output_to
from worker_agent.runtime.process import warm
from worker_agent.runtime.process.forked import end_as_an_interpreter

ADOPTION_SECONDS = 10.0  # how long a forked warm trainer waits to become the agent's child before it gives up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker_agent.runtime.process.zygote")
    parser.add_argument("--spool", required=True, help="the zygote's own folder (its pid and log)")
    parser.add_argument("--parent", required=True, type=int, help="the agent: the warm trainers' parent")
    args = parser.parse_args(argv)
    warm._tune_allocator()
    warm._preload()
    return serve(args.parent)


def serve(parent: int) -> int:
    """Answer the agent's requests on stdin until it closes the pipe; the imports are done by now.

    Besides a warm trainer (``{"spool": PATH}``), the agent may ask once, first, for the environment and log of
    the warm trainers to come (``{"env": {...}, "log": PATH}``, unanswered): a zygote its process forked before it
    became the agent (:mod:`spotmorph.local.vm_start`) started with the environment the agent had then."""
    for line in sys.stdin:  # one request a line; the loop ends when the agent closes the pipe
        try:
            request = json.loads(line)
            if isinstance(request, dict) and "env" in request:
                _settle(request["env"], request["log"])
                continue
            spool = str(request["spool"])
        except (ValueError, KeyError, TypeError, OSError) as exc:
            _answer({"error": f"not a request: {exc!r}"})
            continue
        if not os.path.isdir(spool):  # the agent gave it up before its turn came
            _answer({"spool": spool, "error": "the spool is gone"})
            continue
        try:
            _answer({"spool": spool, "pid": _fork_warm(spool, parent)})
        except OSError as exc:
            _answer({"spool": spool, "error": f"cannot fork: {exc.strerror or exc}"})
    return 0


def _settle(env: object, log: object) -> None:
    """The agent's environment for the warm trainers, and the zygote's log from now on."""
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError("env is not an object of strings")
    if not isinstance(log, str):
        raise TypeError("log is not a path")
    append_output_to(log, (2,))
    os.environ.clear()
    os.environ.update(env)


def _answer(reply: dict[str, object]) -> None:
    os.write(1, (json.dumps(reply) + "\n").encode())


def _fork_warm(spool: str, parent: int) -> int:
    """Fork a warm trainer for ``spool`` through a middle process that exits at once, so the agent adopts it;
    its pid, once the middle process is gone (the warm trainer is the agent's by then)."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            child = os.fork()
            if child == 0:
                os.close(write_end)
                _become_warm(spool, parent)
            with contextlib.suppress(OSError):  # before its pid is said: a kill of its group reaches it at once
                os.setpgid(child, child)
            os.write(write_end, f"{child}\n".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    said = b""
    while chunk := os.read(read_end, 32):
        said += chunk
    os.close(read_end)
    os.waitpid(middle, 0)
    if not said.strip().isdigit():
        raise OSError(0, "the middle process could not fork")
    return int(said)


def _become_warm(spool: str, parent: int) -> None:
    """The forked warm trainer: its own process group, no stdin, its spool's log; then, once the agent has
    adopted it, a warm trainer like any other. Never returns into the zygote's loop."""

    def warm_trainer() -> NoReturn:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # the middle process may have made it the leader already
        folder = WarmSpool(Path(spool))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        append_output_to(folder.log_file)
        folder.pid_file.write_text(str(os.getpid()))
        deadline = time.monotonic() + ADOPTION_SECONDS
        while os.getppid() != parent:  # the middle process is on its way out; then the agent adopts this one
            if time.monotonic() > deadline:
                raise SystemExit(f"spotmorph warm trainer: not adopted by the agent (pid {parent}); exiting")
            time.sleep(0.001)
        raise SystemExit(warm.main([f"--spool={spool}", f"--parent={parent}"]))

    end_as_an_interpreter(warm_trainer)


if __name__ == "__main__":
    sys.exit(main())
