"""Managed Run Commands on the fake ARM server's VMs, executed for real: the script runs in bash with its
parameters (protected ones too) as environment variables, as Azure's Linux VM agent runs it, except that
``SPOTMORPH_ETC`` is pointed at a folder of that VM's own under ``etc_root`` instead of /etc/spotmorph.

Knobs: ``agent_not_ready`` (VM names whose Run Command fails as a VM agent that has not reported yet).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UNIFORM = r"/virtualMachines/([^/]+)/runCommands/([^/]+)"
FLEXIBLE = r"/providers/Microsoft\.Compute/virtualMachines/([^/]+)/runCommands/([^/]+)"


@dataclass
class Execution:
    vm: str
    parameters: dict[str, str]  # the plain ones
    protected: dict[str, str]
    exit_code: int


@dataclass
class FakeRunCommands:
    etc_root: Path
    agent_not_ready: set[str] = field(default_factory=set)
    executions: list[Execution] = field(default_factory=list)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)  # path -> the run command's JSON

    def etc(self, vm: str) -> Path:
        return self.etc_root / vm

    @staticmethod
    def match(path: str, vmss: str, group_prefix: str) -> tuple[str, str, bool] | None:
        """(VM key, run command name, uniform) of a run command path, or None."""
        uniform = re.fullmatch(re.escape(vmss) + UNIFORM, path)
        if uniform:
            return uniform.group(1), uniform.group(2), True
        flexible = re.fullmatch(re.escape(group_prefix) + FLEXIBLE, path)
        if flexible:
            return flexible.group(1), flexible.group(2), False
        return None

    def run(self, vm: str, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str] | None]:
        """Execute a PUT's script on ``vm``; its resource JSON and the error the operation ends with, if any."""
        props = body.get("properties") or {}
        plain = {p["name"]: p["value"] for p in props.get("parameters") or []}
        protected = {p["name"]: p["value"] for p in props.get("protectedParameters") or []}
        if vm in self.agent_not_ready:
            error = {"code": "VMAgentStatusCommunicationError", "message": f"VM '{vm}' has not reported status"}
            return self._resource(path, body, "Failed"), error
        env = {"PATH": os.environ["PATH"], **plain, **protected, "SPOTMORPH_ETC": str(self.etc(vm))}
        script = (props.get("source") or {}).get("script", "")
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        self.executions.append(Execution(vm, plain, protected, done.returncode))
        if done.returncode != 0 and props.get("treatFailureAsDeploymentFailure"):
            error = {"code": "VMExtensionProvisioningError", "message": f"exit {done.returncode}: {done.stderr[-200:]}"}
            return self._resource(path, body, "Failed"), error
        return self._resource(path, body, "Succeeded"), None

    def _resource(self, path: str, body: dict[str, Any], state: str) -> dict[str, Any]:
        props = {k: v for k, v in (body.get("properties") or {}).items() if k != "protectedParameters"}
        resource = {
            "id": path,
            "name": path.rsplit("/", 1)[-1],
            "type": "Microsoft.Compute/virtualMachines/runCommands",
            "location": body.get("location", ""),
            "properties": {**props, "provisioningState": state},
        }
        self.resources[path] = resource
        return resource
