"""A stateful fake of the few Azure Resource Manager endpoints the scale-set provider calls.

Served over HTTPS on 127.0.0.1 (aiohttp, a test CA), so the provider runs the real SDK path end to end:
``ComputeManagementClient`` with its aiohttp transport, bearer-token policy, retry policy (429 and
Retry-After), ARM long-running-operation polling (``Azure-AsyncOperation`` and ``Location``), paging
(``nextLink``) and error mapping. One scale set of Spot priority, and more where a test adds them
(``add_scale_set``: a Regular one for on-demand VMs, say), each with its own VMs, served by the first's server;
VMs have a provisioning state and a power state.

Knobs for scenarios: ``throttle(n, after)`` (the next n requests get 429), ``capacity_unavailable``
(scale-outs fail with AllocationFailed), ``op_polls`` (how many polls an operation stays InProgress),
``eviction_policy`` (Delete: an evicted VM disappears; Deallocate: it stays deallocated).
"""

from __future__ import annotations

import itertools
import json
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.client.certs import make_cluster_certs
from tests.azure.fake_arm_json import flexible_json, uniform_json, vmss_json
from tests.azure.fake_run_command import FakeRunCommands

API = "2026-04-01"
TOKEN = "fake-arm-token"


@dataclass
class FakeVm:
    instance_id: str
    name: str
    provisioning: str = "Creating"
    power: str = "starting"
    listed_deleting: bool = False  # an evicted VM (Delete policy) shows once as Deleting, then is gone


@dataclass
class Operation:
    id: str
    polls_left: int
    done: Callable[[], None]
    fail: Callable[[], None] | None = None
    error: dict[str, str] | None = None
    status: str = "InProgress"
    on_set: bool = True  # an operation on the scale set (a VM's Run Command is not: it blocks nothing)


@dataclass
class FakeArm:
    subscription: str
    group: str
    scale_set: str
    orchestration: str = "Uniform"
    eviction_policy: str = "Delete"
    max_price: float = -1.0
    location: str = "westeurope"
    op_polls: int = 1
    capacity_unavailable: bool = False
    page_size: int = 5
    vms: dict[str, FakeVm] = field(default_factory=dict)
    operations: dict[str, Operation] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    base_url: str = ""
    ca_file: Path | None = None
    _throttle: int = 0
    _retry_after: int = 0
    _ids: Any = field(default_factory=lambda: itertools.count())
    _ops: Any = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None
    run_commands: FakeRunCommands | None = None  # made by start(): VMs' /etc/spotmorph under its folder
    priority: str = "Spot"  # Regular: on-demand VMs (no eviction policy, no max price)
    root: FakeArm | None = None  # the scale set whose server serves this one (None: this one's own)
    siblings: dict[str, FakeArm] = field(default_factory=dict)  # other scale sets in the group, by name

    # -- test controls

    def add_running(self, count: int) -> list[str]:
        names = []
        for _ in range(count):
            vm = self._new_vm()
            vm.provisioning, vm.power = "Succeeded", "running"
            names.append(vm.name)
        return names

    def add_scale_set(self, name: str, priority: str = "Regular") -> FakeArm:
        """A second scale set in the same group, served here (knobs such as op_polls and throttle are the server's)."""
        sibling = FakeArm(self.subscription, self.group, name, self.orchestration, location=self.location)
        sibling.priority, sibling.root, sibling.requests = priority, self, self.requests
        sibling.run_commands, sibling._ops = self.run_commands, self._ops
        self.siblings[name] = sibling
        return sibling

    def throttle(self, requests: int, retry_after: int) -> None:
        self._throttle, self._retry_after = requests, retry_after

    def in_progress(self) -> list[Operation]:
        return [op for op in self.operations.values() if op.status == "InProgress" and op.on_set]

    def finish_operations(self) -> None:
        """Let every running operation end (as if enough time passed)."""
        for op in self.in_progress():
            self._end(op)

    @property
    def capacity(self) -> int:
        return len(self.vms)

    def running(self) -> list[str]:
        return sorted(v.name for v in self.vms.values() if v.power == "running" and v.provisioning == "Succeeded")

    def mutations(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.requests if m in ("PATCH", "POST") and not p.endswith("simulateEviction")]

    # -- server

    async def start(self, folder: Path) -> str:
        make_cluster_certs(folder, ["127.0.0.1"], [])
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(folder / "server.crt", folder / "server.key")
        self.ca_file = folder / "ca.crt"
        self.run_commands = FakeRunCommands(folder / "vm-etc")
        for sibling in self.siblings.values():
            sibling.run_commands = self.run_commands
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"https://127.0.0.1:{port}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- ARM

    @property
    def _vmss_path(self) -> str:
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{self.group}"
            f"/providers/Microsoft.Compute/virtualMachineScaleSets/{self.scale_set}"
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path, method = request.path, request.method
        self.requests.append((method, path))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _error(401, "AuthenticationFailed", "no or wrong bearer token")
        if self._throttle > 0:
            self._throttle -= 1
            response = _error(429, "TooManyRequests", "throttled")
            response.headers["Retry-After"] = str(self._retry_after)
            return response
        if request.query.get("api-version") != API and "/operations/" not in path and "/operationResults/" not in path:
            return _error(400, "InvalidApiVersion", f"api-version {request.query.get('api-version')}")
        body: Any = await request.json() if request.can_read_body else None
        prefix = f"/subscriptions/{self.subscription}/resourceGroups/"
        if path.lower().startswith(prefix.lower()) and not path.lower().startswith(f"{prefix}{self.group}/".lower()):
            return _error(404, "ResourceGroupNotFound", f"Resource group '{path.split('/')[4]}' could not be found.")
        return self._scale_set_for(request)._serve(request, body)

    def _scale_set_for(self, request: web.Request) -> FakeArm:
        """The scale set a request is about: by its path, its listing's filter, or the VM or operation it names."""
        for sibling in self.siblings.values():
            vmss, path = sibling._vmss_path, request.path
            if path == vmss or path.startswith(f"{vmss}/") or vmss in request.query.get("$filter", ""):
                return sibling
            if any(f"/virtualMachines/{vm.name}/" in path for vm in sibling.vms.values()):
                return sibling
            if path.rsplit("/", 1)[-1] in sibling.operations:
                return sibling
        return self

    def _serve(self, request: web.Request, body: Any) -> web.StreamResponse:
        path, method = request.path, request.method
        vmss = self._vmss_path
        prefix = f"/subscriptions/{self.subscription}/resourceGroups/"
        if path == vmss and method == "GET":
            return web.json_response(vmss_json(self))
        if path == vmss and method == "PATCH":
            return self._update(body)
        if path == f"{vmss}/virtualMachines" and method == "GET":
            return self._list(request, [uniform_json(self, v) for v in self._listing(request)])
        if path == f"{vmss}/delete" and method == "POST":
            return self._delete(body)
        match = re.fullmatch(re.escape(vmss) + r"/virtualMachines/([^/]+)/simulateEviction", path)
        if match and method == "POST":
            return self._evict(match.group(1))
        if path == f"{prefix}{self.group}/providers/Microsoft.Compute/virtualMachines":
            expected = f"'virtualMachineScaleSet/id' eq '{vmss}'"
            if request.query.get("$filter") != expected:
                return _error(400, "InvalidFilter", f"$filter {request.query.get('$filter')!r}")
            return self._list(request, [flexible_json(self, v) for v in self._listing(request)])
        run_command = FakeRunCommands.match(path, vmss, f"{prefix}{self.group}")
        if run_command is not None:
            return self._run_command(method, path, body, *run_command)
        operation = (
            r"/subscriptions/[^/]+/providers/Microsoft.Compute/locations/[^/]+/(operations|operationResults)/([^/]+)"
        )
        match = re.fullmatch(operation, path)
        if match and method == "GET":
            return self._poll(match.group(1), match.group(2))
        if path.startswith(f"{prefix}{self.group}/providers/Microsoft.Compute/virtualMachineScaleSets/"):
            return _error(404, "ResourceNotFound", f"The Resource '{path.rsplit('/', 1)[-1]}' was not found.")
        return _error(404, "NotFound", f"{method} {path}")

    def _new_vm(self) -> FakeVm:
        number = next(self._ids)
        if self.orchestration == "Uniform":
            vm = FakeVm(str(number), f"{self.scale_set}_{number}")
        else:
            name = f"{self.scale_set}_{number:08x}"
            vm = FakeVm(name, name)
        self.vms[vm.instance_id] = vm
        return vm

    def _listing(self, request: web.Request) -> list[FakeVm]:
        if "$skiptoken" in request.query:  # a later page of the same listing: no state change
            return list(self.vms.values())
        for vm in list(self.vms.values()):
            if vm.listed_deleting:
                del self.vms[vm.instance_id]  # an evicted VM under the Delete policy is gone now
        shown = list(self.vms.values())
        for vm in shown:
            if vm.provisioning == "Deleting" and vm.power == "deallocating":
                vm.listed_deleting = True
        return shown

    def _busy(self) -> web.Response | None:
        if self.in_progress():
            return _error(409, "Conflict", "another operation on the scale set is in progress")
        return None

    def _operation(
        self,
        done: Callable[[], None],
        fail: Callable[[], None] | None = None,
        error: dict[str, str] | None = None,
        status: int = 202,
        on_set: bool = True,
    ) -> web.Response:
        server = self.root or self
        op = Operation(f"op-{next(self._ops)}", server.op_polls, done, fail, error, on_set=on_set)
        self.operations[op.id] = op
        base = f"{server.base_url}/subscriptions/{self.subscription}/providers/Microsoft.Compute"
        base += f"/locations/{self.location}"
        headers = {
            "Azure-AsyncOperation": f"{base}/operations/{op.id}?api-version={API}",
            "Location": f"{base}/operationResults/{op.id}?api-version={API}",
        }
        body = vmss_json(self) if status == 200 else None
        if body is None:
            return web.Response(status=status, headers=headers)
        return web.json_response(body, status=status, headers=headers)

    def _update(self, body: dict[str, Any]) -> web.Response:
        busy = self._busy()
        if busy is not None:
            return busy
        profile = (body.get("properties") or {}).get("virtualMachineProfile") or {}
        price = (profile.get("billingProfile") or {}).get("maxPrice")
        if price is not None:
            self.max_price = float(price)
        wanted = (body.get("sku") or {}).get("capacity")
        if wanted is None or wanted <= self.capacity:
            return self._operation(lambda: None, status=200)
        created = [self._new_vm() for _ in range(int(wanted) - self.capacity)]

        def done() -> None:
            for vm in created:
                if vm.instance_id in self.vms:
                    vm.provisioning, vm.power = "Succeeded", "running"

        def fail() -> None:
            for vm in created:
                self.vms.pop(vm.instance_id, None)

        error = None
        if self.capacity_unavailable:
            error = {"code": "AllocationFailed", "message": "Allocation failed: no Spot capacity for this size."}
        return self._operation(done, fail, error, status=200)

    def _delete(self, body: dict[str, Any]) -> web.Response:
        ids = [str(i) for i in (body or {}).get("instanceIds", [])]
        known = [i for i in ids if i in self.vms]
        if not known:
            return _error(404, "NotFound", f"instances {ids} are not in the scale set")
        busy = self._busy()
        if busy is not None:
            return busy
        for i in known:
            self.vms[i].provisioning = "Deleting"

        def done() -> None:
            for i in known:
                self.vms.pop(i, None)

        return self._operation(done)

    def _run_command(self, method: str, path: str, body: Any, key: str, name: str, uniform: bool) -> web.Response:
        assert self.run_commands is not None
        vm = self.vms.get(key) if uniform else next((v for v in self.vms.values() if v.name == key), None)
        if vm is None or uniform != (self.orchestration == "Uniform"):
            return _error(404, "ResourceNotFound", f"The Resource '{key}' was not found.")
        if method == "GET":
            found = self.run_commands.resources.get(path)
            return web.json_response(found) if found else _error(404, "ResourceNotFound", name)
        if method == "DELETE":
            self.run_commands.resources.pop(path, None)
            return self._operation(lambda: None, on_set=False)
        if method != "PUT":
            return _error(405, "MethodNotAllowed", method)
        if vm.power != "running":
            return _error(409, "OperationNotAllowed", f"VM {vm.name} is {vm.power}")
        resource, error = self.run_commands.run(vm.name, path, body or {})
        response = self._operation(lambda: None, error=error, status=201, on_set=False)
        response.text = dumps(resource)
        response.content_type = "application/json"
        return response

    def _evict(self, instance_id: str) -> web.Response:
        vm = self.vms.get(instance_id)
        if vm is None:
            return _error(404, "NotFound", f"instance {instance_id}")
        if self.eviction_policy == "Delete":
            vm.provisioning, vm.power = "Deleting", "deallocating"
        else:
            vm.power = "deallocated"
        return web.Response(status=204)

    def _poll(self, kind: str, op_id: str) -> web.Response:
        op = self.operations.get(op_id)
        if op is None:
            return _error(404, "NotFound", f"operation {op_id}")
        if op.status == "InProgress":
            if op.polls_left > 0:
                op.polls_left -= 1
            else:
                self._end(op)
        if kind == "operationResults":
            return web.Response(status=202 if op.status == "InProgress" else 204)
        document: dict[str, Any] = {"name": op.id, "status": op.status}
        if op.status == "Failed" and op.error:
            document["error"] = op.error
        return web.json_response(document)

    def _end(self, op: Operation) -> None:
        if op.error is not None:
            op.status = "Failed"
            if op.fail:
                op.fail()
        else:
            op.status = "Succeeded"
            op.done()

    def _list(self, request: web.Request, items: list[dict[str, Any]]) -> web.Response:
        start = int(request.query.get("$skiptoken", "0"))
        page = items[start : start + self.page_size]
        document: dict[str, Any] = {"value": page}
        if start + self.page_size < len(items):
            query = "&".join(f"{k}={v}" for k, v in request.query.items() if k != "$skiptoken")
            document["nextLink"] = (
                f"{(self.root or self).base_url}{request.path}?{query}&$skiptoken={start + self.page_size}"
            )
        return web.json_response(document)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
