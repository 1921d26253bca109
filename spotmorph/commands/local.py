"""``spotmorph local``: an embedded cluster on this machine (controller, agents, an IMDS "platform").

``up`` starts a controller on loopback with generated tokens, a local Scheduled Events service and
N agent processes with K CPU slots each, and writes the client context so that plain ``spotmorph
jobs`` talks to it. ``preempt`` announces an eviction through the same IMDS protocol Azure uses;
when its ``NotBefore`` passes (or the agent acknowledges it) the platform kills the "VM". ``kill``
ends a VM without notice; ``replay`` drives adds and evictions from a trace; ``down`` stops
everything and removes the cluster's files. The work is done in :mod:`spotmorph.local`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from morphing.errors import UserInputError
from spotmorph.local import cluster, platform, replay
from spotmorph.local.provider import kill_vm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start a local cluster")
    up.add_argument("--nodes", type=int, default=2, help="agent processes (default 2)")
    up.add_argument("--slots", type=int, default=2, help="CPU slots per node (default 2)")
    up.add_argument("--heartbeat-expiry", type=float, default=6.0, help="seconds before a silent node is LOST")
    up.add_argument("--debounce", type=float, default=3.0, help="seconds to wait after arrivals before growing")
    add = sub.add_parser("add", help="add nodes")
    add.add_argument("count", type=int, nargs="?", default=1)
    preempt = sub.add_parser("preempt", help="evict a node with notice (Scheduled Events)")
    preempt.add_argument("node")
    preempt.add_argument("--notice", type=float, default=30.0, metavar="SECONDS")
    kill = sub.add_parser("kill", help="evict a node without notice")
    kill.add_argument("node")
    trace = sub.add_parser("replay", help="drive the cluster from an availability trace")
    trace.add_argument("trace", type=Path)
    trace.add_argument("--speedup", type=float, default=60.0, help="trace seconds per wall second")
    trace.add_argument("--max-nodes", type=int, default=4, help="scale the trace to at most this many nodes")
    trace.add_argument("--notice", type=float, default=30.0, help="eviction notice in trace seconds (0: kill)")
    sub.add_parser("down", help="stop everything and clean up")
    hidden = sub.add_parser("platform", help=argparse.SUPPRESS)
    hidden.add_argument("--cluster-dir", type=Path, required=True)
    hidden.add_argument("--port", type=int, required=True)


def run(args: argparse.Namespace) -> int:
    action = args.local_command
    if action == "platform":
        return platform.serve(args.cluster_dir, args.port)
    if action == "up":
        options = cluster.UpOptions(args.nodes, args.slots, args.heartbeat_expiry, args.debounce)
        context, names = cluster.up(options)
        nodes = ", ".join(names) or "none"
        print(f"local cluster up: controller {context.controller}, nodes {nodes} ({options.slots} slots each)")
        print(f"files in {context.cluster_dir}; try `spotmorph nodes`, `spotmorph submit examples/tiny_gpt.yaml`")
        return 0
    context = cluster.require_context()
    provider = cluster.provider_of(context)
    if action == "add":
        if args.count < 1:
            raise UserInputError(f"add {args.count}: add at least 1 node")
        provider.start(args.count)
        print(f"starting {args.count} node(s); they appear in `spotmorph nodes` once registered")
    elif action == "preempt":
        if args.notice < 0:
            raise UserInputError(f"--notice {args.notice}: it must be >= 0 seconds")
        cluster.require_node(provider, args.node)
        event = platform.schedule_eviction(context.imds_url, args.node, args.notice)
        print(f"eviction {event} of {args.node} announced with {args.notice:.0f}s notice")
    elif action == "kill":
        kill_vm(cluster.require_node(provider, args.node))
        print(f"{args.node} killed without notice")
    elif action == "replay":
        trace = replay.load_trace(args.trace)
        scaling = replay.ReplayOptions(args.speedup, args.max_nodes, args.notice)
        replay.replay(trace, provider, context.imds_url, scaling, say=lambda line: print(line, flush=True))
    else:
        cluster.down(context)
        print("local cluster stopped and cleaned up")
    return 0
