"""``spotmorph local partition | heal | netem``: network faults of one node of a ``--netns`` cluster."""

from __future__ import annotations

import argparse

from morphing.errors import UserInputError
from spotmorph.local import netns
from spotmorph.local.network import NetworkPlan, PartitionFrom, check_shaping
from spotmorph.local.provider import LocalProcessProvider, LocalVm


def _network_of(provider: LocalProcessProvider, node: str) -> tuple[NetworkPlan, LocalVm]:
    plan = netns.load_plan(provider.files)
    if plan is None:
        raise UserInputError(
            "network faults need a cluster whose VMs are network namespaces: "
            "`spotmorph local down`, then `spotmorph local up --netns`"
        )
    vm = provider.find(node)
    if vm is None:
        known = sorted(n for v in provider.vms() if (n := v.node_name))
        raise UserInputError(f"no VM here runs node {node!r}; nodes: {', '.join(known) or 'none'}")
    return plan, vm


def run(provider: LocalProcessProvider, args: argparse.Namespace) -> str:
    """Perform one fault verb; returns the line to print."""
    plan, vm = _network_of(provider, args.node)
    if args.local_command == "partition":
        kind = PartitionFrom(args.cut_from)
        netns.partition(plan, vm.serial, kind)
        return f"{args.node} partitioned from {kind.value} (until `spotmorph local heal {args.node}`)"
    if args.local_command == "heal":
        found = netns.heal(plan, vm.serial)
        return f"{args.node} healed" if found else f"{args.node} had no partition or netem to undo"
    check_shaping(args.delay, args.loss, args.rate)
    how = netns.shape(plan, vm.serial, args.delay, args.loss, args.rate)
    return f"{args.node}'s outgoing traffic: {how} (until `spotmorph local heal {args.node}`)"
