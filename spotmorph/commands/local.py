"""``spotmorph local``: an embedded cluster on this machine (controller, agents, an IMDS "platform").

``up`` starts a controller on loopback with generated tokens, a local metadata service (``--cloud``: Azure's
Scheduled Events by default, AWS's IMDSv2 or GCP's metadata server) and N agent processes with K slots each (CPU
slots, or GPUs of this host with ``--gpus-per-node``), and writes the client context so that plain ``spotmorph
jobs`` talks to it. ``preempt`` announces an eviction through that cloud's own protocol, and the platform kills
the "VM" when that cloud would; ``rebalance`` sends AWS's early warning. ``kill`` ends a VM without notice;
``replay`` drives adds and evictions from a trace; ``down`` stops everything and removes the cluster's files. With
``up --netns`` every VM is a network namespace, and ``partition``, ``heal`` and ``netem`` break and slow its
links. The work is done in :mod:`spotmorph.local`.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from morphing.errors import UserInputError
from morphing.words import plural
from scheduler.pools import PoolKind
from spotmorph.local import cluster, controllers, faults, platform, replay
from spotmorph.local.clouds import DEFAULT_NOTICE, require_warning
from spotmorph.local.flags import MAX_NOTICE_SECONDS, within
from spotmorph.local.layout import ClusterDir
from spotmorph.local.network import PartitionFrom, check_shaping
from spotmorph.local.provider import kill_vm
from worker_agent.notices.facts import CLOUDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    _add_up(sub.add_parser("up", help="start a local cluster"))
    add = sub.add_parser("add", help="add nodes")
    add.add_argument("--on-demand", action="store_true", help="on-demand VMs: the cloud never evicts them")
    sub.add_parser("vms", help="list the VMs: name, node, pool (spot or on-demand), alive")
    add.add_argument("count", type=int, nargs="?", default=1, help="how many VMs (default 1)")
    preempt = sub.add_parser("preempt", help="evict a node with notice, the way the cluster's cloud does")
    preempt.add_argument("node", help="the node to evict (node-N, as `spotmorph nodes` lists it)")
    preempt.add_argument(
        "--notice",
        type=float,
        metavar="SECONDS",
        help="seconds between the notice and the end (default: the cloud's, 30 on azure and gcp, 120 on aws)",
    )
    rebalance = sub.add_parser(
        "rebalance", help="warn that a node is at risk of eviction (aws: rebalance recommendation)"
    )
    rebalance.add_argument("node", help="the node at risk (node-N)")
    kill = sub.add_parser("kill", help="evict a node without notice")
    kill.add_argument("node", help="the node whose VM ends now")
    trace = sub.add_parser("replay", help="drive the cluster from an availability trace")
    trace.add_argument(
        "trace", type=Path, help="an availability trace (CSV: seconds,add|remove,vm), as examples/traces"
    )
    trace.add_argument("--speedup", type=float, default=60.0, help="trace seconds per wall second")
    trace.add_argument("--max-nodes", type=int, default=4, help="scale the trace to at most this many nodes")
    trace.add_argument("--notice", type=float, default=30.0, help="eviction notice in trace seconds (0: kill)")
    partition = sub.add_parser("partition", help="cut a --netns node off the network (until `heal`)")
    partition.add_argument("node", help="the --netns node to cut off")
    partition.add_argument(
        "--from",
        dest="cut_from",
        choices=[k.value for k in PartitionFrom],
        default=PartitionFrom.ALL.value,
        help="cut it off from the controller, its peers, or all (default all)",
    )
    heal = sub.add_parser("heal", help="undo a node's partition and netem")
    heal.add_argument("node", help="the --netns node to reconnect")
    netem = sub.add_parser("netem", help="delay, drop or rate-limit a --netns node's traffic (tc netem)")
    netem.add_argument("node", help="the --netns node whose link to shape")
    netem.add_argument("--delay", type=float, metavar="MS", help="added latency in milliseconds")
    netem.add_argument("--loss", type=float, metavar="PCT", help="packets dropped, in percent")
    netem.add_argument("--rate", type=float, metavar="MBIT", help="bandwidth limit in Mbit/s")
    sub.add_parser("kill-leader", help="SIGKILL the leading controller (--controllers N); prints its address")
    sub.add_parser("down", help="stop everything and clean up (also after a crash)")
    hidden = sub.add_parser("platform")  # internal (started by `up`): no help, so not listed
    hidden.add_argument("--cluster-dir", type=Path, required=True, help="the cluster's folder")
    hidden.add_argument("--host", default="127.0.0.1", help="address to serve the metadata endpoint on")
    hidden.add_argument("--port", type=int, required=True, help="port to serve it on")


def _add_up(up: argparse.ArgumentParser) -> None:
    up.add_argument("--nodes", type=int, default=2, help="agent processes (default 2)")
    up.add_argument("--slots", type=int, help="slots per node (default 2 CPU slots, or --gpus-per-node)")
    up.add_argument(
        "--gpus-per-node",
        type=int,
        default=0,
        metavar="K",
        help="give each node K GPUs of this host for its own (one slot per GPU); default 0: CPU slots",
    )
    up.add_argument("--heartbeat-expiry", type=float, default=6.0, help="seconds before a silent node is LOST")
    up.add_argument("--debounce", type=float, default=3.0, help="seconds to wait after arrivals before growing")
    up.add_argument(
        "--netns",
        action="store_true",
        help="every VM a network namespace on a bridge (root; see docs/local-cluster.md)",
    )
    up.add_argument("--subnet", help="the --netns cluster's /24 (default: a free one of 10.77.0.0/16)")
    up.add_argument(
        "--tensorboard-dir", type=Path, help="the controller writes TensorBoard event files here, a folder per job"
    )
    up.add_argument(
        "--controllers",
        type=int,
        default=1,
        metavar="N",
        help="controller processes (default 1); N > 1 needs --database",
    )
    up.add_argument(
        "--database", metavar="URL", help="postgresql://USER@HOST:PORT/DB the controllers share (one leads)"
    )
    up.add_argument(
        "--on-demand-nodes",
        type=int,
        default=0,
        metavar="N",
        help="the controller starts up to N on-demand VMs (never evicted) for jobs whose deadline is at risk",
    )
    for name, default in (("safety", 900), ("on-demand-start", 120), ("outlook-step", 600)):
        up.add_argument(
            f"--deadline-{name}" if name != "on-demand-start" else f"--{name}",
            type=float,
            metavar="SECONDS",
            help=f"the scheduler's {name.replace('-', ' ')} seconds for deadlines (default {default})",
        )
    up.add_argument(
        "--cloud",
        choices=CLOUDS,
        default="azure",
        help="the cloud the platform plays: its metadata service and notice path (azure: Scheduled Events, the "
        "default; aws: IMDSv2 instance-action and rebalance recommendation; gcp: preempted and a SIGTERM)",
    )


def run(args: argparse.Namespace) -> int:
    action = args.local_command
    if action == "platform":
        return platform.serve(args.cluster_dir, args.port, args.host)
    if action == "up":
        slots = args.slots if args.slots is not None else (args.gpus_per_node if args.gpus_per_node > 0 else 2)
        options = cluster.UpOptions(
            args.nodes, slots, args.heartbeat_expiry, args.debounce, args.netns, args.subnet, args.gpus_per_node
        )
        if args.tensorboard_dir is not None:
            options = replace(options, tensorboard_dir=args.tensorboard_dir.resolve())
        options = replace(options, controllers=args.controllers, database=args.database, cloud=args.cloud)
        timing = {
            "safety_seconds": args.deadline_safety,
            "on_demand_start_seconds": args.on_demand_start,
            "outlook_step_seconds": args.deadline_outlook_step,
        }
        chosen = tuple((k, v) for k, v in timing.items() if v is not None)
        options = replace(options, on_demand_nodes=args.on_demand_nodes, scheduler=chosen)
        context, names = cluster.up(options)
        nodes = ", ".join(names) or "none"
        where = " in network namespaces" if options.netns else ""
        each = plural(options.slots, "slot") + (
            f", {plural(options.gpus_per_node, 'GPU')}" if options.gpus_per_node else ""
        )
        heads = ", ".join(context.addresses())
        said = f"controllers {heads} (the first leads)" if len(context.addresses()) > 1 else f"controller {heads}"
        print(f"local cluster up ({options.cloud}): {said}, nodes {nodes}{where} ({each} each)")
        print(f"files in {context.cluster_dir}; try `spotmorph nodes`, `spotmorph submit examples/tiny_gpt.yaml`")
        files = ClusterDir(Path(context.cluster_dir))
        # The reader's token: the dashboard only reads, and an address on a screen (or in a shell history) with
        # the operator's token in it would let whoever sees it cancel jobs.
        print(f"dashboard: {files.dashboard_url()} (token: the reader's in {files.reader_token})")
        return 0
    if action == "down":
        removed = cluster.down()
        network = f" (removed {len(removed)} namespaces and links)" if removed else ""
        print(f"local cluster stopped and cleaned up{network}")
        return 0
    check_numbers(args)
    context = cluster.require_context()
    if action == "kill-leader":
        killed = controllers.kill_leader(ClusterDir(Path(context.cluster_dir)))
        print(killed.lease.address)
        print(f"killed controller {killed.index} (epoch {killed.lease.epoch}); a standby takes over within the lease")
        return 0
    provider = cluster.provider_of(context)
    if action in {"partition", "heal", "netem"}:
        print(faults.run(provider, args))
        return 0
    if action == "add":
        pool = PoolKind.ON_DEMAND if args.on_demand else PoolKind.SPOT
        provider.start(args.count, pool)
        print(f"starting {args.count} {pool} node(s); they appear in `spotmorph nodes` once registered")
    elif action == "vms":
        for vm in provider.vms():
            print(f"{vm.name:<10} {vm.node_name or '-':<10} {vm.pool:<10} {'alive' if vm.alive() else 'gone'}")
    elif action == "preempt":
        vm = cluster.require_node(provider, args.node, evicting="cannot preempt")
        notice = DEFAULT_NOTICE[provider.cloud] if args.notice is None else args.notice
        said = platform.announce_eviction(provider.cloud, context.imds_url, vm.name, args.node, notice)
        print(f"{said} of {args.node} announced with {notice:.0f}s notice ({provider.cloud})")
    elif action == "rebalance":
        require_warning(provider.cloud)
        vm = cluster.require_node(provider, args.node, evicting="no eviction risk for")
        said = platform.announce_risk(provider.cloud, context.imds_url, vm.name)
        print(f"{said} for {args.node}: the controller grows nothing onto it and moves its job off when it can")
    elif action == "kill":
        kill_vm(cluster.require_node(provider, args.node))
        print(f"{args.node} killed without notice")
    elif action == "replay":
        trace = replay.load_trace(args.trace)
        scaling = replay.ReplayOptions(args.speedup, args.max_nodes, args.notice)
        replay.replay(trace, provider, context.imds_url, scaling, say=lambda line: print(line, flush=True))
    return 0


def check_numbers(args: argparse.Namespace) -> None:
    """A verb's numeric flags, checked before it looks for the cluster: a bad one is named whatever is up."""
    action = args.local_command
    if action == "netem":
        check_shaping(args.delay, args.loss, args.rate)
    elif action == "preempt" and args.notice is not None:
        within("--notice", args.notice, 0, MAX_NOTICE_SECONDS, "seconds")
    elif action == "replay":
        replay.ReplayOptions(args.speedup, args.max_nodes, args.notice).check()
    elif action == "add" and args.count < 1:
        raise UserInputError(f"add {args.count}: add at least 1 node")
