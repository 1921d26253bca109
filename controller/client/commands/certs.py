"""``spotmorph certs DIR``: a CA, a server certificate and client certificates for mutual TLS."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="folder to write ca.crt, server.crt/key and client certs to")
    parser.add_argument("--host", action="append", default=[], help="controller host name or IP (repeatable)")
    parser.add_argument("--client", action="append", default=[], help="client certificate name (default: client)")


def run(args: argparse.Namespace) -> int:
    from controller.client.certs import make_cluster_certs

    hosts = args.host or ["localhost", "127.0.0.1"]
    for path in make_cluster_certs(args.out, hosts, args.client or ["client"]):
        print(path)
    return 0
