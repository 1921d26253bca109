"""``spotmorph submit``: the client's submit, with the model's layer names found here for the profile check.

The controller refuses a profile measured for other layers, but it never runs a submitter's code; this
command builds the job's model on the meta device (no weights in memory: seconds, whatever its size) and
sends the names. ``--skip-model-check`` submits without them, for a machine that cannot import the model.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from controller.client.commands import submit
from morphing.errors import UserInputError
from morphing.jobspec import JobSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    submit.add_arguments(parser)
    parser.add_argument(
        "--skip-model-check",
        action="store_true",
        help="do not build the model here to check its profile's layers (the controller then cannot check them)",
    )


def model_layers(spec: JobSpec) -> tuple[str, ...]:
    from worker_agent.runtime.model.meta_build import model_layer_names

    try:
        with contextlib.redirect_stdout(sys.stderr):  # what the user's code prints must not mix with --json
            return model_layer_names(spec.entrypoint)
    except UserInputError as exc:
        raise UserInputError(
            f"building the model here to check its profile failed: {exc}; fix the entrypoint, or submit with "
            "--skip-model-check where this machine cannot import it"
        ) from None


def run(args: argparse.Namespace) -> int:
    return submit.run(args, None if args.skip_model_check else model_layers)
