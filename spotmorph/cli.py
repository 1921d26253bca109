"""Entry point of the ``spotmorph`` command.

Each subcommand lives in a module with ``add_arguments(parser)`` and ``run(args) -> int``. Modules are
imported when the parser is built, so they keep heavy imports (torch, grpc) inside ``run``: ``spotmorph
plan`` must not pay for torch. :class:`morphing.errors.UserInputError` becomes one line on stderr
and exit code 2; a reader that closes the pipe early (``| head``) ends the command with exit 0 and no
traceback, for every command at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from morphing.errors import UserInputError

# (name, module, one-line help); order is the order of `spotmorph --help`.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("plan", "spotmorph.commands.plan", "best layout for N GPUs from a calibration profile (what-if)"),
    ("simulate", "spotmorph.commands.simulate", "replay a spot-availability trace against spotmorph and baselines"),
    ("demo", "spotmorph.commands.demo", "the main demo"),
    ("train", "worker_agent.commands.train", "run a job on this machine with P x D local processes"),
    ("checkpoint", "worker_agent.commands.checkpoint", "verify or compare checkpoints"),
    ("profile", "worker_agent.commands.profile", "calibrate a model: per-layer times and memory"),
    ("data", "worker_agent.commands.data", "prepare training data: tokenize text files into a token file"),
    ("agent", "worker_agent.commands.agent", "the worker agent daemon of one node"),
    ("local", "spotmorph.commands.local", "an embedded cluster of agent processes on this machine"),
    ("controller", "spotmorph.commands.controller", "the controller daemon (gRPC API, state, morphing decisions)"),
    ("submit", "spotmorph.commands.submit", "submit a job spec (YAML) to the controller"),
    ("jobs", "controller.client.commands.jobs", "list jobs"),
    ("status", "controller.client.commands.status", "one job in detail: state, step, layout, morphs"),
    ("nodes", "controller.client.commands.nodes", "list the cluster's nodes"),
    ("controllers", "controller.client.commands.controllers", "each listed controller: leading, standby or down"),
    ("events", "controller.client.commands.events", "the controller's event log (--follow to keep watching)"),
    ("logs", "controller.client.commands.logs", "what a job's trainers wrote, every rank and generation (--follow)"),
    ("cancel", "controller.client.commands.cancel", "cancel a job"),
    ("timeline", "controller.client.commands.timeline", "one picture of a job over time (HTML or PNG)"),
    ("agent-token", "controller.app.commands.agent_token", "the agent token of one VM (a node added by hand)"),
    ("certs", "controller.client.commands.certs", "make a CA and TLS certificates for a cluster (mutual TLS)"),
    ("azure", "controller.app.commands.azure", "Azure: check a config and the template offline, render cloud-init"),
    ("gcp", "controller.app.commands.gcp", "GCP: on a worker VM, trade its identity token for its agent token"),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    parser = _Parser(prog="spotmorph", description="Elastic pipeline-parallel training on spot VMs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    modules: dict[str, ModuleType] = {}
    for name, module_name, help_text in COMMANDS:
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        modules[name] = module
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; output cut short by its reader (``spotmorph events | head -1``) ends quietly."""
    try:
        try:
            return _dispatch(argv)
        finally:  # inside the try: a flush at exit would print "Exception ignored ... BrokenPipeError"
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return 0  # the reader has what it wanted: a `set -o pipefail` script does not fail on `| head`


def _dispatch(argv: Sequence[str] | None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = modules[args.command].run(args)
    except UserInputError as exc:
        print(f"spotmorph {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def _discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null (the Python docs' recipe), so what is still buffered is dropped
    at exit instead of failing again; a stdout with no descriptor of its own (a test's capture) is left."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
