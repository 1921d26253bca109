"""The local cluster's directory, ``$SPOTMORPH_HOME/local``: one class naming every file in it.

::

    local/
      controller.yaml   the controller's settings        controller.json  its command line
      controller.pid    controller.log                   platform.pid     platform.log
      network.json      a --netns cluster's subnet and name prefix
      network-made.jsonl  its namespaces and links, each recorded before it was made
      gpus.json         the host's GPU indices, recorded by `up --gpus-per-node` (shared out per VM)
      cloud             the cloud `up --cloud` plays (azure, aws or gcp; absent: azure)
      state/            the controller's --state-dir: SQLite store, operator.token, node-secret
      controllers/c-K/  with `up --controllers N`, controller K >= 2: its state/, controller.json, .pid, .log
                        (controller 1 keeps the files above)
      database.url      with `up --database`, the PostgreSQL URL the controllers share (0600)
      vms/vm-N/         one "VM": the agent's --work-dir (agent.pid, node-name, trainers/, see
                        worker_agent.contract.AgentWorkDir), its command line agent.json and agent.log,
                        its own agent token agent.token (issued to instance vm-N)

Nothing here starts or reads a process; :mod:`spotmorph.local.provider` and :mod:`.cluster` do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from controller.tokens import NODE_SECRET
from scheduler.pools import PoolKind
from worker_agent.contract import AgentWorkDir

LOCAL = "local"  # the cluster's folder in $SPOTMORPH_HOME
VM_PREFIX = "vm-"


@dataclass(frozen=True)
class VmDir:
    """``vms/vm-N/``: one VM's folder, which is its agent's work directory."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def serial(self) -> int:
        suffix = self.path.name.rsplit("-", 1)[-1]
        return int(suffix) if suffix.isdigit() else 0

    @property
    def work_dir(self) -> AgentWorkDir:
        return AgentWorkDir(self.path)

    @property
    def pid_file(self) -> Path:
        return self.work_dir.pid_file

    @property
    def node_name_file(self) -> Path:
        return self.work_dir.node_name_file

    @property
    def token_file(self) -> Path:
        """The VM's own agent token: it proves to the controller that the agent runs on this VM."""
        return self.path / "agent.token"

    @property
    def command_file(self) -> Path:
        """The agent's command line (JSON), so the VM's agent can be started again the same way."""
        return self.path / "agent.json"

    @property
    def log(self) -> Path:
        return self.path / "agent.log"

    @property
    def pool_file(self) -> Path:
        """Which pool the VM is of (``spot``, ``on-demand``); a VM without one, from before pools, is spot."""
        return self.path / "pool"

    @property
    def pool(self) -> PoolKind:
        try:
            return PoolKind(self.pool_file.read_text().strip())
        except (OSError, ValueError):
            return PoolKind.SPOT

    @property
    def pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None

    @property
    def node_name(self) -> str | None:
        """The name the controller gave the agent when it registered (``node-1``, ...), else None."""
        try:
            return self.node_name_file.read_text().strip() or None
        except OSError:
            return None

    def command(self) -> list[str]:
        return [str(arg) for arg in json.loads(self.command_file.read_text())]


@dataclass(frozen=True)
class ControllerFiles:
    """One controller's files: its ``--state-dir``, command line, pid and log."""

    state: Path
    command: Path
    pid_file: Path
    log: Path

    @property
    def address_file(self) -> Path:
        """HOST:PORT it serves at (written once it answers)."""
        return self.state / "controller.addr"


@dataclass(frozen=True)
class ClusterDir:
    """The cluster's folder and every file in it."""

    root: Path

    @classmethod
    def of_home(cls, home: Path) -> ClusterDir:
        """The cluster of ``$SPOTMORPH_HOME`` = ``home``."""
        return cls(home / LOCAL)

    @classmethod
    def of_state_dir(cls, state_dir: Path) -> ClusterDir:
        """The cluster whose controller keeps its state in ``state_dir``."""
        return cls(Path(state_dir).resolve().parent)

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def operator_token(self) -> Path:
        return self.state / "operator.token"

    @property
    def reader_token(self) -> Path:
        return self.state / "reader.token"

    @property
    def metrics_address(self) -> Path:
        """HOST:PORT of the controller's metrics and dashboard (written once it serves them)."""
        return self.state / "metrics.addr"

    def dashboard_url(self) -> str:
        """The dashboard's address (its page asks for a token: the operator's or the reader's file)."""
        return f"http://{self.metrics_address.read_text().strip()}/"

    @property
    def node_secret(self) -> Path:
        """What the controller derives every VM's agent token from (written when it starts)."""
        return self.state / NODE_SECRET

    @property
    def controller_settings(self) -> Path:
        return self.root / "controller.yaml"

    @property
    def controller_command(self) -> Path:
        """The controller's command line (JSON), so a crashed controller can be started again."""
        return self.root / "controller.json"

    @property
    def controller_pid(self) -> Path:
        return self.root / "controller.pid"

    @property
    def controller_log(self) -> Path:
        return self.root / "controller.log"

    def controller_files(self, index: int = 1) -> ControllerFiles:
        """Controller ``index`` (1: the first, whose files are at the top; others under ``controllers/``)."""
        if index == 1:
            return ControllerFiles(self.state, self.controller_command, self.controller_pid, self.controller_log)
        folder = self.root / "controllers" / f"c-{index}"
        return ControllerFiles(
            folder / "state", folder / "controller.json", folder / "controller.pid", folder / "controller.log"
        )

    def controllers(self) -> list[ControllerFiles]:
        """Every controller the cluster was started with, the first first."""
        extra = self.root / "controllers"
        more = sorted(int(d.name[2:]) for d in extra.glob("c-*") if d.name[2:].isdigit()) if extra.is_dir() else []
        return [self.controller_files(i) for i in (1, *more)]

    @property
    def database_url(self) -> Path:
        """The PostgreSQL URL of ``up --database`` (absent: SQLite, one controller)."""
        return self.root / "database.url"

    @property
    def platform_pid(self) -> Path:
        return self.root / "platform.pid"

    @property
    def platform_log(self) -> Path:
        return self.root / "platform.log"

    @property
    def network_plan(self) -> Path:
        """A ``--netns`` cluster's subnet and name prefix (:class:`spotmorph.local.network.NetworkPlan`)."""
        return self.root / "network.json"

    @property
    def network_made(self) -> Path:
        """Every namespace and link of a ``--netns`` cluster, recorded before it was made (JSON lines)."""
        return self.root / "network-made.jsonl"

    @property
    def gpus(self) -> Path:
        """The host's GPU indices as ``local up --gpus-per-node`` found them (:mod:`spotmorph.local.gpu_share`)."""
        return self.root / "gpus.json"

    @property
    def cloud(self) -> Path:
        """The cloud ``local up --cloud`` plays: whose metadata service the platform serves (:mod:`.clouds`)."""
        return self.root / "cloud"

    @property
    def vms(self) -> Path:
        return self.root / "vms"

    def vm(self, serial: int) -> VmDir:
        return VmDir(self.vms / f"{VM_PREFIX}{serial}")

    def vm_dirs(self) -> list[VmDir]:
        """Every VM's folder, in the order they were started."""
        if not self.vms.is_dir():
            return []
        return sorted((VmDir(d) for d in self.vms.iterdir() if d.is_dir()), key=lambda v: v.serial)

    def pid_files(self) -> list[Path]:
        """Where every process of the cluster wrote its pid: controller, platform, agents."""
        controllers = [c.pid_file for c in self.controllers()]
        files = [*controllers, self.platform_pid, *(vm.pid_file for vm in self.vm_dirs())]
        return [f for f in files if f.exists()]

    def logs(self) -> list[Path]:
        """Every log in the cluster (controller, platform, agents, trainers)."""
        return sorted(self.root.rglob("*.log")) if self.root.is_dir() else []
