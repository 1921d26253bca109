"""A pytest worker's fork server for ``python -m spotmorph.cli ...`` (and ``python -c``): the suite's commands
without the imports.

The suite runs ``spotmorph train`` (and ``checkpoint``, ``profile``) a few hundred times, each a new
interpreter importing torch and the runtime (3-6 s of CPU on the 2-core machines it runs on; the suite is
bound by their CPU). This process imports them once (what ``spotmorph train``'s launcher imports before it
forks its ranks), then forks one child per command: the child takes the command's working directory,
environment, argv and the default signal handlers, points stdout and stderr at files, and runs the module as
``python -m`` does (:func:`runpy.run_module`); its exit code comes back as an interpreter's would. Only
commands whose behaviour is the command's own go through it (``tests/runtime/helpers.py``: ``run``); a test
that measures a process (its page faults, its memory, its imports) starts a new interpreter.

Protocol, one JSON line each way: ``{"argv": [...], "cwd": ..., "env": {...}, "out": PATH, "err": PATH}``; the
answer ``{"pid": N}`` once forked, then ``{"exit": CODE}``. It ends when its stdin closes.

It also forks a node's zygote for a test's supervisor (:func:`zygote`; ``{"zygote": {"requests": FIFO, "answers":
FIFO, "parent": PID}}``): the imports it holds are a zygote's (torch, the runtime; no user code ever runs here),
so a supervisor's trainers are forks, not interpreters that import torch again. It forks through a middle
process, as the zygote forks a warm trainer, so the zygote is adopted by the asking pytest worker, which is a
child subreaper while that test runs (tests/agent/zygotes.py); the answer is the zygote's pid, then the middle
process's exit code.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import runpy
import signal
import sys
from typing import Any

from worker_agent.runtime.process.forked import end_as_an_interpreter


def preload() -> None:
    from worker_agent.runtime.process.forked import preload as rank_imports
    from worker_agent.runtime.process.warm import MODEL_LIBRARIES

    rank_imports()
    importlib.import_module("spotmorph.cli")
    importlib.import_module("controller.app.daemon")  # a controller's start (the startup tests' refused starts)
    for name in MODEL_LIBRARIES:
        if importlib.util.find_spec(name.partition(".")[0]) is not None:
            importlib.import_module(name)


def answer(reply: dict[str, Any]) -> None:
    os.write(1, (json.dumps(reply) + "\n").encode())


def child(request: dict[str, Any]) -> None:
    """The command, as a new interpreter would run it; never returns."""

    def command() -> None:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        flag, target, *rest = request["argv"]
        if flag == "-c":  # as `python -c CODE ARGS...` runs CODE
            sys.path[0], sys.argv = "", ["-c", *rest]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            return
        if flag != "-m":
            raise SystemExit(f"forkserver: only `python -m MODULE ...` or `python -c CODE ...`, not {flag!r}")
        sys.path[0] = os.getcwd()  # as `python -m` has it
        sys.argv = [target, *rest]
        sys.modules.pop(target, None)  # as in a new interpreter: the module runs as __main__, not imported first
        runpy.run_module(target, run_name="__main__", alter_sys=True)

    end_as_an_interpreter(command)


def zygote(request: dict[str, Any]) -> None:
    """The middle process: fork the zygote (its own process group, the FIFOs as its stdin and stdout, serving
    ``parent``'s requests), say its pid on stdout and exit, leaving it to the subreaper above; never returns."""

    def serve() -> int:
        from worker_agent.runtime.process import warm
        from worker_agent.runtime.process import zygote as node_zygote

        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        answers = os.open(request["answers"], os.O_WRONLY)  # first: the asking worker waits on the other
        requests = os.open(request["requests"], os.O_RDONLY)  # waits for the asking worker's end
        for opened, fd in ((requests, 0), (answers, 1)):
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (fd 0 is the FIFO now)
        warm._tune_allocator()
        return node_zygote.serve(int(request["parent"]))

    def middle() -> None:
        pid = os.fork()
        if pid == 0:
            end_as_an_interpreter(lambda: sys.exit(serve()))
        answer({"pid": pid})

    end_as_an_interpreter(middle)


def main() -> int:
    preload()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            if "zygote" in request:
                zygote(request["zygote"])
            child(request)
        if "zygote" not in request:
            answer({"pid": pid})
        _, status = os.waitpid(pid, 0)
        answer({"exit": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
