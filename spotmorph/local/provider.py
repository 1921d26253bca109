"""The local provider: every "VM" is a ``spotmorph agent`` process with K slots on this machine.

It is the embedded default for trying spotmorph without a cloud. An instance lives in
``cluster_dir/vms/vm-<serial>/`` (:class:`~spotmorph.local.layout.VmDir`): the agent's work directory,
its command line and log, its own agent token (the controller's HMAC of its instance id ``vm-<serial>``,
so that no other VM can register as it); once it has registered, ``node-name`` (the controller names
nodes ``node-1``, ``node-2``, ... in join order). Each agent leads a session of its own, and its trainers stay in it, so
killing an instance kills what a dying VM takes with it, the whole session, without knowing where the
agent keeps its trainers' files.

The controller never imports this module: ``spotmorph controller`` registers it as the factory of
``provider: local`` (``controller.app.providers.make_provider``'s ``extra``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.eventlog.provider_facts import LocalVmsStarted
from controller.files import write_private
from controller.providers.base import ProviderPort, SilentPort, instances_for
from controller.tokens import issue_vm_token
from scheduler.pools import PoolKind
from spotmorph.local import gpu_share, netns, vm_start
from spotmorph.local.clouds import read_cloud, vm_metadata_url
from spotmorph.local.layout import ClusterDir, VmDir
from spotmorph.local.processes import alive, reap, session_members, spawn, wait_gone
from worker_agent.notices.facts import Cloud

AGENT_COMMAND = (sys.executable, "-m", "spotmorph.cli", "agent")


@dataclass(frozen=True)
class LocalVm(VmDir):
    """A VM's folder and the processes in it."""

    def alive(self) -> bool:
        return alive(self.pid)

    def session_pids(self) -> list[int]:
        """Every process still in the agent's session: the agent, its trainers, their warm spares."""
        leader = self.pid
        return [] if leader is None else session_members(leader)


class LocalProcessProvider:
    """Agents as local processes; ``request_capacity`` starts them, ``release`` and ``kill`` end them."""

    def __init__(
        self,
        cluster_dir: Path,
        controller: str,
        slots: int = 1,
        imds_url: str | None = None,
        command: Sequence[str] = AGENT_COMMAND,
        *,
        max_nodes: int = 0,
        port: ProviderPort | None = None,
        gpus_per_node: int = 0,
        state_dir: Path | None = None,
        fork_vms: bool = False,
        cloud: Cloud | None = None,
        max_on_demand_nodes: int | None = None,
    ) -> None:
        """``state_dir``: the controller's, whose secret the VMs' agent tokens derive from (default: the cluster's).
        ``fork_vms``: start CPU VMs as forks of this process, which imports once for all (:mod:`vm_start`).
        ``cloud``: whose metadata the agents watch at ``imds_url`` (default: the cluster's, :mod:`.clouds`).
        ``max_on_demand_nodes``: on-demand VMs (never evicted by the cloud) at most (default: ``max_nodes``)."""
        self.cluster_dir = cluster_dir
        self.files = ClusterDir(cluster_dir)
        self.controller = controller
        self.state_dir = state_dir or self.files.state
        self.slots = slots
        self.imds_url = imds_url
        self.command = tuple(command)
        self.max_nodes = max_nodes  # request_capacity starts agents up to this many alive VMs (0: never)
        self.max_on_demand_nodes = max_nodes if max_on_demand_nodes is None else max_on_demand_nodes
        self.port: ProviderPort = port or SilentPort()
        self.gpus_per_node = gpus_per_node  # each VM's own GPUs of this host (0: CPU slots)
        self.fork_vms = fork_vms
        self.cloud: Cloud = cloud or read_cloud(self.files)

    def vms(self) -> list[LocalVm]:
        return [LocalVm(vm.path) for vm in self.files.vm_dirs()]

    def find(self, node: str) -> LocalVm | None:
        return next((vm for vm in self.vms() if vm.node_name == node), None)

    async def list_pools(self) -> dict[str, PoolKind]:
        """Registered VMs alive now, each with its pool (the file its VM's folder keeps)."""
        return {name: vm.pool for vm in self.vms() if vm.alive() and (name := vm.node_name)}

    async def list_instances(self) -> frozenset[str]:
        return frozenset(await self.list_pools())

    async def request_capacity(self, slots: int, pool: PoolKind = PoolKind.SPOT) -> None:
        """Start agents until the alive VMs of ``pool`` (registered or still booting) hold ``slots`` slots, up to
        ``max_nodes`` (spot) or ``max_on_demand_nodes`` (on-demand).

        Booting VMs count, so asking again before they register starts nothing more. A lower level stops
        nothing: the controller releases the VMs it no longer needs.
        """
        alive_vms = sum(1 for vm in self.vms() if vm.alive() and vm.pool is pool)
        ceiling = self.max_nodes if pool is PoolKind.SPOT else self.max_on_demand_nodes
        missing = min(ceiling, instances_for(slots, self.slots)) - alive_vms
        if missing > 0:
            started = self.start(missing, pool)
            names = [vm.name for vm in started]
            self.port.report(LocalVmsStarted(names, self.slots, ", ".join(names)))

    async def release(self, name: str) -> None:
        vm = self.find(name)
        if vm is not None:
            kill_vm(vm)

    async def close(self) -> None:
        return None  # agents outlive the controller, as VMs would

    def start(self, count: int, pool: PoolKind = PoolKind.SPOT) -> list[LocalVm]:
        """Start ``count`` agents of ``pool`` now, each with the agent token of its own instance; each registers and
        gets its node name from the controller (a respawned agent, with the same token, gets it back).

        In a ``--netns`` cluster each VM gets a network namespace of its own first, its agent runs in it
        (``ip netns exec``) and advertises the namespace's address."""
        self.files.vms.mkdir(parents=True, exist_ok=True)
        serial = max((vm.serial for vm in self.files.vm_dirs()), default=0)
        plan = netns.load_plan(self.files)
        inventory = gpu_share.recorded(self.files.gpus) if self.gpus_per_node else ()
        held = [i for vm in self.vms() if vm.alive() for i in gpu_share.held_by(vm.command())] if inventory else []
        started = []
        for _ in range(count):
            gpus = gpu_share.allocate(inventory, held, self.gpus_per_node) if self.gpus_per_node else ()
            held += gpus
            serial += 1
            vm = LocalVm(self.files.vm(serial).path)
            where: list[str] = []
            if plan is not None:
                plan.check_serial(serial)
                netns.add_vm(self.files, plan, serial)
                where = netns.exec_prefix(plan.namespace(serial))
            vm.path.mkdir(parents=True)
            vm.pool_file.write_text(f"{pool}\n")
            write_private(vm.token_file, f"{issue_vm_token(self.state_dir, vm.name)}\n".encode())
            args = [
                *where,
                *self.command,
                "--controller",
                self.controller,
                "--token-file",
                str(vm.token_file),
                "--slots",
                str(self.slots),
                gpu_share.GPUS_FLAG,  # GPUs of its own (NCCL: one GPU per rank), or CPU slots
                gpu_share.flag_value(gpus),
                "--work-dir",
                str(vm.path),
                "--instance-id",
                vm.name,
            ]
            if self.imds_url:
                args += ["--imds-url", vm_metadata_url(self.cloud, self.imds_url, vm.name)]
            if self.cloud != "azure":
                args += ["--cloud", self.cloud]
            if plan is not None:
                args += ["--address", plan.vm_address(serial)]
            vm.command_file.write_text(json.dumps(args))
            self.respawn(vm)
            started.append(vm)
        return started

    def respawn(self, vm: VmDir) -> None:
        """Start a VM's agent (again, after a crash: same node name, a new incarnation) from its command line."""
        namespace, agent = netns.split_exec_prefix(vm.command())
        pid = None
        if self.fork_vms and not self.gpus_per_node and vm_start.can_fork():
            pid = vm_start.start(agent, vm.log, namespace)
        if pid is None:
            pid = spawn(vm.command(), vm.log)
        vm.pid_file.write_text(str(pid))


def kill_vm(vm: LocalVm, sig: int = signal.SIGKILL) -> None:
    """What a VM's death does: the agent and every trainer on it end at once (no notice, no checkpoint).

    The agent goes first, so it cannot start another trainer while its session is being emptied."""
    if vm.pid is None:
        return
    signalled = False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(vm.pid, sig)
        signalled = True
    members = vm.session_pids()
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    if signalled and sig == signal.SIGKILL:  # released or evicted: gone once this returns (list_pools says so)
        wait_gone(vm.pid)
    for pid in [vm.pid, *members]:
        reap(pid)
