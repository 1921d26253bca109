"""``spotmorph controllers``: every listed controller's role (leading, standby, no answer), epoch and leader.

Each address of ``--controller a,b`` (or the context) is asked on its own, so an operator sees at once which
head node leads, which stand by, and which is down.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from controller.client.commands.common import EXIT_UNAVAILABLE, add_client_arguments, dump, table

ASK_SECONDS = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from controller.client import connection as client

    addresses, token = client.resolve(args.controller, args.token)
    opener = client.Opener.of(token, args.tls_ca, args.tls_cert, args.tls_key)
    found = [ask(address, opener) for address in addresses]
    if args.json:
        dump(found)
    else:
        rows = [(c["address"], c["role"], c["epoch"] or "-", c["leader"] or "-") for c in found]
        print(table(rows, ("CONTROLLER", "ROLE", "EPOCH", "LEADER")))
    if not any(c["role"] != "NO ANSWER" for c in found):
        print(f"spotmorph {args.command}: no controller answers at {', '.join(addresses)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def ask(address: str, opener: Any) -> dict[str, Any]:
    """One controller's GetClusterState role fields; ``NO ANSWER`` with gRPC's reason when the call fails."""
    import grpc

    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    channel = opener(address)
    try:
        state = rpc.ClusterStub(channel).GetClusterState(pb.GetClusterStateRequest(), timeout=ASK_SECONDS)
        return {"address": address, "role": state.role or "LEADING", "epoch": state.epoch, "leader": state.leader}
    except grpc.RpcError as exc:
        why = f"{exc.code().name}: {exc.details()}"
        return {"address": address, "role": "NO ANSWER", "epoch": 0, "leader": "", "error": why}
    finally:
        channel.close()
