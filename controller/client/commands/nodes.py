"""``spotmorph nodes``: the cluster's nodes in join order, with the GPUs each one reported."""

from __future__ import annotations

import argparse
from typing import Any

from controller.client.commands.common import add_client_arguments, call, dump, follow_pages, table
from morphing.gpus import describe_gpus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    def every_page(channel: Any) -> list[Any]:
        stub = rpc.ClusterStub(channel)
        return follow_pages(lambda token: stub.ListNodes(pb.ListNodesRequest(page_token=token)), "nodes")

    found, code = call(args, every_page)
    if found is None:
        return code
    nodes = [
        {
            "name": n.name,
            "state": pb.NodeState.Name(n.state).removeprefix("NODE_STATE_"),
            "slots": n.slots,
            "job": n.job or None,
            "incarnation": n.incarnation,
            "address": n.address,
            "gpus": [{"index": g.index, "name": g.name, "memory_bytes": g.memory_bytes} for g in n.gpus],
        }
        for n in found
    ]
    if args.json:
        dump(nodes)
        return 0
    rows = [(n["name"], n["state"], n["slots"], gpus_cell(n["gpus"]), n["job"] or "-", n["incarnation"]) for n in nodes]
    print(table(rows, ("NAME", "STATE", "SLOTS", "GPUS", "JOB", "INCARNATION")))
    return 0


def gpus_cell(gpus: list[dict[str, Any]]) -> str:
    """``2x H100 80GB``; ``-`` for a CPU node."""
    return describe_gpus((g["name"], g["memory_bytes"]) for g in gpus)
