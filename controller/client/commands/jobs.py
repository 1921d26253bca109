"""``spotmorph jobs``: every job, newest last."""

from __future__ import annotations

import argparse
from typing import Any

from controller.client.commands.common import (
    add_client_arguments,
    call,
    describe_layout,
    dump,
    follow_pages,
    job_dict,
    table,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    def every_page(channel: Any) -> list[Any]:
        stub = rpc.JobsStub(channel)
        return follow_pages(lambda token: stub.ListJobs(pb.ListJobsRequest(page_token=token)), "jobs")

    found, code = call(args, every_page)
    if found is None:
        return code
    jobs = [job_dict(j) for j in found]
    if args.json:
        dump(jobs)
        return 0
    rows = [
        (j["id"], j["name"], j["state"], f"{j['step']}/{j['total_steps']}", j["generation"], describe_layout(j))
        for j in jobs
    ]
    print(table(rows, ("ID", "NAME", "STATE", "STEP", "GEN", "LAYOUT")))
    return 0
