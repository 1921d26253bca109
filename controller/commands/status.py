"""``spotmorph status JOB``: one job in detail, with its morphs."""

from __future__ import annotations

import argparse

from controller.commands.common import add_client_arguments, call, describe_layout, dump, job_dict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job id, e.g. job-1")
    add_client_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    reply, code = call(args, lambda ch: rpc.JobsStub(ch).GetJob(pb.GetJobRequest(id=args.job)))
    if reply is None:
        return code
    job = job_dict(reply)
    if args.json:
        dump(job)
        return 0
    print(f"{job['id']} ({job['name']}): {job['state']}  step {job['step']}/{job['total_steps']}")
    print(f"  generation {job['generation']}, layout {describe_layout(job)}")
    print(f"  checkpoints in {job['checkpoint_dir']}, last at step {job['last_checkpoint_step']}")
    print(f"  steps lost {job['steps_lost']}, restarts {job['restarts']}")
    if job["reason"]:
        print(f"  {job['reason']}")
    for morph in job["morphs"]:
        print(f"  morph to generation {morph['generation']} in {morph['seconds']:.1f} s: {morph['cause']}")
    return 0
