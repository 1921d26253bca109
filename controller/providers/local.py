"""The local provider: every "VM" is a ``spotmorph agent`` process with K CPU slots on this machine.

It is the embedded default for trying spotmorph without a cloud. An instance lives in
``cluster_dir/vms/vm-<serial>/``: the agent's work directory, its ``agent.pid``, and, once it has
registered, ``node-name`` (the controller names nodes ``node-1``, ``node-2``, ... in join order).
Each agent leads a session of its own, and its trainers stay in it, so killing an instance kills what a
dying VM takes with it, the whole session, without knowing where the agent keeps its trainers' files.
The controller only starts processes by command line, so it never imports the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.core.events import EventKind
from controller.providers.base import ProviderPort, SilentPort, instances_for


@dataclass(frozen=True)
class LocalVm:
    directory: Path

    @property
    def pid(self) -> int | None:
        try:
            return int((self.directory / "agent.pid").read_text())
        except (OSError, ValueError):
            return None

    @property
    def node_name(self) -> str | None:
        try:
            return (self.directory / "node-name").read_text().strip() or None
        except OSError:
            return None

    def alive(self) -> bool:
        pid = self.pid
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return not _is_zombie(pid)

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
        agent_token_file: Path,
        slots: int = 1,
        imds_url: str | None = None,
        command: Sequence[str] = (sys.executable, "-m", "spotmorph.cli", "agent"),
        *,
        max_nodes: int = 0,
        port: ProviderPort | None = None,
    ) -> None:
        self.cluster_dir = cluster_dir
        self.controller = controller
        self.agent_token_file = agent_token_file
        self.slots = slots
        self.imds_url = imds_url
        self.command = tuple(command)
        self.max_nodes = max_nodes  # request_capacity starts agents up to this many alive VMs (0: never)
        self.port: ProviderPort = port or SilentPort()

    @property
    def vms_dir(self) -> Path:
        return self.cluster_dir / "vms"

    def vms(self) -> list[LocalVm]:
        if not self.vms_dir.exists():
            return []
        return sorted((LocalVm(d) for d in self.vms_dir.iterdir() if d.is_dir()), key=lambda v: _serial(v.directory))

    def find(self, node: str) -> LocalVm | None:
        return next((vm for vm in self.vms() if vm.node_name == node), None)

    async def list_instances(self) -> frozenset[str]:
        return frozenset(name for vm in self.vms() if vm.alive() and (name := vm.node_name))

    async def request_capacity(self, slots: int) -> None:
        """Start agents until the alive VMs (registered or still booting) hold ``slots`` slots, up to ``max_nodes``.

        Booting VMs count, so asking again before they register starts nothing more.
        """
        alive = sum(1 for vm in self.vms() if vm.alive())
        missing = min(self.max_nodes, instances_for(slots, self.slots)) - alive
        if missing > 0:
            started = self.start(missing)
            names = [vm.directory.name for vm in started]
            self.port.report(
                EventKind.LOCAL_VMS_STARTED, {"vms": names, "slots": self.slots, "message": ", ".join(names)}
            )

    async def release(self, name: str) -> None:
        vm = self.find(name)
        if vm is not None:
            kill_vm(vm)

    async def close(self) -> None:
        return None  # agents outlive the controller, as VMs would

    def start(self, count: int) -> list[LocalVm]:
        """Start ``count`` agents now; each registers and gets its node name from the controller."""
        self.vms_dir.mkdir(parents=True, exist_ok=True)
        serial = max((_serial(vm.directory) for vm in self.vms()), default=0)
        started = []
        for _ in range(count):
            serial += 1
            vm = LocalVm(self.vms_dir / f"vm-{serial}")
            vm.directory.mkdir(parents=True)
            args = [
                *self.command,
                "--controller",
                self.controller,
                "--token-file",
                str(self.agent_token_file),
                "--slots",
                str(self.slots),
                "--work-dir",
                str(vm.directory),
                "--instance-id",
                f"vm-{serial}",
            ]
            if self.imds_url:
                args += ["--imds-url", self.imds_url]
            (vm.directory / "agent.json").write_text(json.dumps(args))
            self._spawn(vm)
            started.append(vm)
        return started

    def respawn(self, vm: LocalVm) -> None:
        """Start a VM's agent again (a restart after a crash): same node name, a new incarnation."""
        self._spawn(vm)

    def _spawn(self, vm: LocalVm) -> None:
        args = json.loads((vm.directory / "agent.json").read_text())
        with open(vm.directory / "agent.log", "ab") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        (vm.directory / "agent.pid").write_text(str(process.pid))


def kill_vm(vm: LocalVm, sig: int = signal.SIGKILL) -> None:
    """What a VM's death does: the agent and every trainer on it end at once (no notice, no checkpoint).

    The agent goes first, so it cannot start another trainer while its session is being emptied."""
    if vm.pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(vm.pid, sig)
    members = vm.session_pids()
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    for pid in [vm.pid, *members]:
        _reap(pid)


def session_members(session: int) -> list[int]:
    """Live processes whose session id is ``session`` (from /proc; none where there is no /proc)."""
    members = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                # After "pid (command) ": state, parent, process group, session, ...
                fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z" and int(fields[3]) == session:
                members.append(int(entry.name))
    return members


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _serial(directory: Path) -> int:
    suffix = directory.name.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else 0
