"""``spotmorph cancel JOB``: stop a job and free its nodes."""

from __future__ import annotations

import argparse

from controller.client.commands.common import add_client_arguments, call, dump, job_dict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job id, e.g. job-1")
    add_client_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    reply, code = call(args, lambda ch: rpc.JobsStub(ch).CancelJob(pb.CancelJobRequest(id=args.job)))
    if reply is None:
        return code
    if args.json:
        dump(job_dict(reply))
    else:
        print(f"{reply.id} cancelled")
    return 0
