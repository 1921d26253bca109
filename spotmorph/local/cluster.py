"""Bringing a local cluster up and down, and finding the one that is up (the client context).

``up`` starts a controller on loopback with generated tokens, the platform (the metadata service of the
cloud it plays: Azure's Scheduled Events unless ``--cloud`` says otherwise) and N agent processes, and writes the
client context, so that plain ``spotmorph jobs`` talks to the cluster; ``down`` stops every process and removes
the cluster's files and the context.

With ``netns`` every VM is a network namespace on a bridge (:mod:`spotmorph.local.netns`): the
controller and the platform listen on the bridge's addresses, each agent runs in its namespace and
advertises that namespace's address. ``down`` also removes the namespaces, veths and bridge, after a
crash too (from the cluster's record and by its name prefix).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.client.context import Context, read_context, remove_context, spotmorph_home, write_context
from controller.files import write_private
from morphing.errors import UserInputError
from scheduler.pools import PoolKind
from spotmorph.local import controllers, daemons, gpu_share, netns, platform, vm_start
from spotmorph.local.flags import within
from spotmorph.local.layout import ClusterDir
from spotmorph.local.netns import leftovers
from spotmorph.local.network import prefix_of
from spotmorph.local.processes import alive, free_port, port_range_base, read_pid, terminate, wait_for
from spotmorph.local.provider import LocalProcessProvider, LocalVm, kill_vm
from worker_agent.agent import gpu_probe
from worker_agent.agent.gpus import describe
from worker_agent.notices.facts import Cloud

# A local morph is a process restart (bench/morph_bench.py measures it), not a VM boot.
MORPH_COST_SECONDS = 8.0


# The `local up` flags of the controller's ``scheduler:`` settings.
SCHEDULER_FLAGS = {
    "safety_seconds": "--deadline-safety",
    "on_demand_start_seconds": "--on-demand-start",
    "outlook_step_seconds": "--deadline-outlook-step",
}


@dataclass(frozen=True)
class UpOptions:
    nodes: int = 2  # agent processes
    slots: int = 2  # CPU slots per node
    heartbeat_expiry: float = 6.0  # seconds before a silent node is LOST
    debounce: float = 3.0  # seconds to wait after arrivals before growing
    netns: bool = False  # every VM a network namespace on a bridge
    subnet: str | None = None  # the --netns cluster's /24 (None: a free one of 10.77.0.0/16)
    gpus_per_node: int = 0  # GPUs of this host each VM gets for its own (0: CPU slots)
    tensorboard_dir: Path | None = None  # where the controller writes TensorBoard event files (None: off)
    controllers: int = 1  # controller processes; more than one share ``database`` (one leads)
    database: str | None = None  # postgresql://...: the controllers' state (None: SQLite in the first's state dir)
    cloud: Cloud = "azure"  # whose metadata service the platform serves and the agents watch (:mod:`.clouds`)
    # The controller's provider starts up to this many on-demand VMs for jobs whose deadline is at risk (0: none;
    # the controller then starts no VM at all, as before); it never starts spot ones (`local add` does).
    on_demand_nodes: int = 0
    # The deadline rule's times (the controller's ``scheduler:`` section; None: its defaults), e.g. seconds for a
    # test whose whole job takes a minute instead of 900 s of safety margin and 120 s for a VM to start.
    scheduler: tuple[tuple[str, float], ...] = ()

    def check(self) -> None:
        if self.nodes < 0 or self.slots < 1:
            raise UserInputError("--nodes must be >= 0 and --slots >= 1")
        controllers.check_controllers(self.controllers, self.database)
        within("--heartbeat-expiry", self.heartbeat_expiry, 0.1, 86_400, "seconds")
        within("--debounce", self.debounce, 0, 86_400, "seconds")
        within("--on-demand-nodes", self.on_demand_nodes, 0, 64, "VMs", zero=True)
        for name, seconds in self.scheduler:
            within(SCHEDULER_FLAGS.get(name, name), seconds, 0.001, 86_400, "seconds")
        if self.gpus_per_node < 0:
            raise UserInputError(f"--gpus-per-node {self.gpus_per_node}: give 0 (CPU slots) or more")
        if self.gpus_per_node and self.slots > self.gpus_per_node:
            raise UserInputError(
                f"--slots {self.slots} with --gpus-per-node {self.gpus_per_node}: each slot trains on a GPU of "
                f"its own (NCCL cannot put two ranks on one GPU); use --slots {self.gpus_per_node} or fewer"
            )


def require_context(home: Path | None = None) -> Context:
    """The context of the local cluster that is up, or a UserInputError saying how to start one."""
    context = read_context(home)
    if context is None or not context.cluster_dir:
        raise UserInputError("no local cluster is up; start one with `spotmorph local up`")
    return context


def provider_of(context: Context) -> LocalProcessProvider:
    """The cluster's VMs, as the provider that starts and lists them."""
    return LocalProcessProvider(
        Path(context.cluster_dir),
        ",".join(context.addresses()),  # agents take the list and find the leader
        context.slots,
        context.imds_url,
        gpus_per_node=context.gpus_per_node,
        fork_vms=os.environ.get(vm_start.FORK_ENV, "1") != "0",  # a command's process: one thread
    )


def require_node(provider: LocalProcessProvider, node: str, evicting: str = "") -> LocalVm:
    """The running VM of ``node``; ``evicting`` (what the cloud would do to it): refused for an on-demand VM,
    which the cloud never takes back."""
    vm = provider.find(node)
    if vm is None or not vm.alive():
        known = sorted(n for v in provider.vms() if v.alive() and (n := v.node_name))
        raise UserInputError(f"node {node!r} is not running here; running nodes: {', '.join(known) or 'none'}")
    if evicting and vm.pool is PoolKind.ON_DEMAND:
        spot = sorted(n for v in provider.vms() if v.alive() and v.pool is PoolKind.SPOT and (n := v.node_name))
        raise UserInputError(
            f"{evicting} {node}: it is an on-demand VM, which the cloud never evicts (`spotmorph local kill` ends "
            f"it as a crash would); spot nodes: {', '.join(spot) or 'none'}"
        )
    return vm


def controller_settings(options: UpOptions, rendezvous_port_base: int, imds_url: str = "") -> dict[str, Any]:
    settings: dict[str, Any] = {
        "heartbeat_expiry_seconds": options.heartbeat_expiry,
        "debounce_seconds": options.debounce,
        "rendezvous_port_base": rendezvous_port_base,
        "morph_cost_seconds": MORPH_COST_SECONDS,
        "metrics_listen": "127.0.0.1:0",  # Prometheus metrics and the web dashboard, on this machine only
        # Every decision checked against controller.core.invariants before it commits: one that breaks an
        # invariant is a bug, refused, logged and recorded (InvariantViolated), and the e2e tests fail on it.
        "validate_invariants": True,
    }
    if options.tensorboard_dir is not None:
        settings["tensorboard_dir"] = str(options.tensorboard_dir)
    if options.database:
        settings["database"] = options.database
    if options.on_demand_nodes:
        local = {"slots": options.slots, "max_nodes": 0, "max_on_demand_nodes": options.on_demand_nodes}
        settings["provider"] = "local"
        settings["local"] = {**local, "poll_seconds": 1.0, **({"imds_url": imds_url} if imds_url else {})}
    if options.scheduler:
        settings["scheduler"] = dict(options.scheduler)
    return settings


def up(options: UpOptions, home: Path | None = None) -> tuple[Context, list[str]]:
    """Start a cluster in ``home/local`` (default ``$SPOTMORPH_HOME``); returns its context and node names."""
    options.check()
    host_gpus = _enough_gpus(options)
    home = home or spotmorph_home()
    cluster = ClusterDir.of_home(home)
    if options.netns:
        netns.require_rights(cluster.root)
    existing = read_context(home)
    if existing is not None and existing.cluster_dir and _controller_alive(ClusterDir(Path(existing.cluster_dir))):
        raise UserInputError("a local cluster is already up; run `spotmorph local down` first")
    netns.teardown(cluster)  # the namespaces and links a crashed --netns cluster of this home left behind
    shutil.rmtree(cluster.root, ignore_errors=True)
    cluster.state.mkdir(parents=True)
    if options.gpus_per_node:
        gpu_share.record(cluster.gpus, host_gpus)
    cluster.cloud.write_text(f"{options.cloud}\n")
    host = platform_host = "127.0.0.1"
    if options.netns:
        plan = netns.make_network(cluster, options.subnet)
        host, platform_host = plan.controller_address, plan.platform_address
    imds_port = free_port()
    addresses = [f"{host}:{free_port()}" for _ in range(options.controllers)]
    address = addresses[0]
    base = port_range_base(500)  # the controller's default span of rendezvous ports
    settings = controller_settings(options, base, f"http://{platform_host}:{imds_port}")
    write_private(cluster.controller_settings, json.dumps(settings).encode())
    if options.database:
        write_private(cluster.database_url, f"{options.database}\n".encode())
    for index, listen in enumerate(addresses, 1):  # --netns: the cluster's own bridge, on this machine only
        files = cluster.controller_files(index)
        files.command.parent.mkdir(parents=True, exist_ok=True)
        line = controllers.command(files, listen, str(cluster.controller_settings), plaintext=options.netns)
        files.command.write_text(json.dumps(line))
    start_controller(cluster)
    platform_command = platform.command(cluster, imds_port, platform_host)
    cluster.platform_pid.write_text(str(daemons.start(platform_command, cluster.platform_log)))
    wait_for(
        lambda: cluster.operator_token.exists() and cluster.node_secret.exists() and cluster.metrics_address.exists(),
        60,
        "the controller to start",
        log=cluster.controller_log,
    )
    standbys = controllers.start_standbys(cluster, options.controllers)
    context = Context(
        controller=address,
        controllers=(address, *standbys) if standbys else (),
        token_file=str(cluster.operator_token),
        cluster_dir=str(cluster.root),
        imds_url=f"http://{platform_host}:{imds_port}",
        slots=options.slots,
        gpus_per_node=options.gpus_per_node,
    )
    write_context(context, home)
    provider = provider_of(context)
    provider.start(options.nodes)
    wait_for(
        lambda: len([v for v in provider.vms() if v.node_name]) >= options.nodes,
        90,
        "the nodes to register",
        log=cluster.controller_log,
    )
    return context, [v.node_name or "?" for v in provider.vms()]


def _enough_gpus(options: UpOptions) -> tuple[int, ...]:
    """The host's GPU indices when ``--gpus-per-node`` asks for GPUs (probed as an agent probes them); a
    :class:`UserInputError` before anything starts when there are fewer than the nodes need."""
    if not options.gpus_per_node:
        return ()
    found, _source = gpu_probe.discover(sys.executable, os.environ)
    need = options.nodes * options.gpus_per_node
    if len(found) < max(need, options.gpus_per_node):
        raise UserInputError(
            f"--gpus-per-node {options.gpus_per_node} for {options.nodes} node(s) needs "
            f"{max(need, options.gpus_per_node)} GPU(s) of this host, and it has {len(found)} "
            f"({describe(found) if found else 'no NVIDIA GPU found'}); use fewer nodes, a smaller "
            "--gpus-per-node, or leave it out for CPU slots"
        )
    return tuple(g.index for g in found)


def _controller_alive(cluster: ClusterDir) -> bool:
    return alive(read_pid(cluster.controller_pid))


def start_controller(cluster: ClusterDir, env: Mapping[str, str] | None = None, index: int = 1) -> int:
    """Start (or restart, after a crash) controller ``index`` of the cluster with its recorded command line."""
    return controllers.start(cluster.controller_files(index), env)


def down(home: Path | None = None) -> list[str]:
    """Stop the controller, the platform, every agent and trainer; remove the network (``--netns``), the
    files and the context. Works after a crash too, context or not; returns the namespaces and links removed.

    A UserInputError when there is nothing at all to stop or remove."""
    home = home or spotmorph_home()
    context = read_context(home)
    cluster = ClusterDir(Path(context.cluster_dir)) if context and context.cluster_dir else ClusterDir.of_home(home)
    if context is None and not cluster.root.exists() and not any(leftovers(prefix_of(cluster.root))):
        raise UserInputError("no local cluster is up; start one with `spotmorph local up`")
    removed = _stop_everything(cluster)
    remove_context(home)
    shutil.rmtree(cluster.root, ignore_errors=True)
    return removed


def _stop_everything(cluster: ClusterDir) -> list[str]:
    """End the cluster's processes, then remove its namespaces and links (whatever of them exists)."""
    for pid_file in (*(c.pid_file for c in cluster.controllers()), cluster.platform_pid):
        terminate(read_pid(pid_file))
    for vm in cluster.vm_dirs():
        kill_vm(LocalVm(vm.path))
    return netns.teardown(cluster)
