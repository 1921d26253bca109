"""``spotmorph submit job.yaml``: validate a job spec locally, send it, print the new job's id.

The controller checks the profile against the names of the model's layers when the request carries
them; it never builds the model itself (that would run a submitter's code on the head node). The
composition root (:mod:`spotmorph.commands.submit`) passes ``model_layers``, which builds it here, once
the controller has answered.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controller.client.commands.common import add_client_arguments, call, dump

if TYPE_CHECKING:
    from morphing.jobspec import JobSpec

ModelLayers = Callable[["JobSpec"], tuple[str, ...]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", help="job spec (YAML); see examples/tiny_gpt.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    parser.add_argument("--schema", action="store_true", help="print the job spec's JSON Schema and exit")
    add_client_arguments(parser)


def run(args: argparse.Namespace, model_layers: ModelLayers | None = None) -> int:
    from controller.spec import entrypoint_problem, load_spec_file, profile_problem
    from morphing.errors import UserInputError
    from morphing.jobspec import job_spec_schema

    if args.schema:
        print(json.dumps(job_spec_schema(), indent=2))
        return 0
    if not args.file:
        raise UserInputError("give a job spec file (or --schema)")
    spec = load_spec_file(args.file, args.set)
    problem = entrypoint_problem(spec) or profile_problem(spec)
    if problem:
        raise UserInputError(f"job spec {args.file}: {problem}")

    from protos.jobspec import spec_to_pb
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    def send(channel: Any) -> Any:
        # Built once the controller answers: building a large model takes seconds, wasted on a wrong address.
        layers = model_layers(spec) if model_layers is not None else ()
        request = pb.SubmitJobRequest(  # the key: a retry makes no second job
            spec=spec_to_pb(spec), idempotency_key=str(uuid.uuid4()), model_layers=layers
        )
        return rpc.JobsStub(channel).SubmitJob(request)

    reply, code = call(args, send)
    if reply is None:
        return code
    if args.json:
        dump({"id": reply.id})
    else:
        print(reply.id)
    return 0
