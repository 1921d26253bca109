"""A stateful fake of the few Compute Engine REST endpoints the GCP provider and deploy/gcp use.

Served over plain HTTP on 127.0.0.1 (aiohttp, on the test's event loop), so the provider runs the real
``google-cloud-compute`` REST client end to end: requests, JSON bodies it parses, errors it maps, pages
(``nextPageToken``) and zone operations that are RUNNING for ``op_polls`` looks, then DONE. One zone;
managed instance groups with instances that are created, preempted, recreated and deleted; instance
templates (validated as the API would: :mod:`tests.gcp.fake_templates`). Google's other side lives here
too: the keys that sign identity tokens (``/oauth2/v3/certs``) and a metadata server speaking for one VM.

Knobs: ``throttle(n, status)`` (the next n requests get 429, or 403 rateLimitExceeded), ``unreachable``
(connections are dropped unanswered), ``stockout`` (instances cannot be created: each keeps CREATING with
its last attempt's error), ``fail_operations`` (resizes and deletes end in that error), ``op_polls``, ``page_size``,
``preempt(name, action)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.gcp.fake_identity import FakeGoogle
from tests.gcp.fake_templates import group_problems, template_name, template_problems

API = "/compute/v1"


@dataclass
class FakeInstance:
    name: str
    id: str = ""  # "" until the VM exists
    status: str = ""  # instanceStatus
    action: str = "CREATING"  # currentAction
    errors: list[tuple[str, str]] = field(default_factory=list)  # lastAttempt


@dataclass
class FakeGroup:
    name: str
    base: str
    template: str
    target_size: int = 0
    instances: dict[str, FakeInstance] = field(default_factory=dict)


@dataclass
class Operation:
    name: str
    kind: str  # "compute.instanceGroupManagers.resize", ...
    target: str
    done: Callable[[], None]
    polls_left: int
    scope: str  # "zones/Z" or "global"
    error: dict[str, str] | None = None
    status: str = "RUNNING"


@dataclass
class FakeCompute:
    project: str = "spotmorph-test"
    zone: str = "us-central1-a"
    op_polls: int = 1
    page_size: int = 5
    stockout: str | None = None  # an error code: instances cannot be created while it is set
    unreachable: bool = False
    fail_operations: dict[str, str] | None = None  # {"code", "message"}: resizes and deletes end DONE with it
    google: FakeGoogle = field(default_factory=FakeGoogle)
    metadata_instance: str | None = None  # the VM the metadata server speaks for
    groups: dict[str, FakeGroup] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, Operation] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    base_url: str = ""
    _throttle: tuple[int, int, int | None] = (0, 429, None)
    _ids: Any = field(default_factory=lambda: itertools.count(4_000_000_000_000_000_001))
    _names: Any = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None

    # -- test controls

    def add_group(self, name: str, template: str = "spotmorph-worker", running: int = 0) -> list[str]:
        """A group (its template need not exist) with ``running`` instances already RUNNING."""
        group = self.groups.setdefault(name, FakeGroup(name, name, template))
        made = [self._new_instance(group) for _ in range(running)]
        for instance in made:
            self._create(instance)
        group.target_size += running
        return [i.name for i in made]

    def throttle(self, requests: int, status: int = 429, retry_after: int | None = None) -> None:
        self._throttle = (requests, status, retry_after)

    def preempt(self, name: str, action: str = "DELETE") -> None:
        """Google preempts a Spot VM: DELETE (the group recreates it under its name) or STOP (it stays stopped)."""
        instance = self.instance(name)
        if action == "DELETE":
            instance.status, instance.action = "STOPPING", "RECREATING"
        else:
            instance.status, instance.action = "TERMINATED", "NONE"

    def instance(self, name: str) -> FakeInstance:
        return next(g.instances[name] for g in self.groups.values() if name in g.instances)

    def running(self, group: str) -> list[str]:
        instances = self.groups[group].instances.values()
        return sorted(i.name for i in instances if i.status == "RUNNING" and i.action == "NONE")

    def mutations(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.requests if m == "POST" and not p.endswith("/listManagedInstances")]

    def in_progress(self) -> list[Operation]:
        return [op for op in self.operations.values() if op.status == "RUNNING"]

    def finish_operations(self) -> None:
        for op in self.in_progress():
            self._end(op)

    def identity_token(self, name: str, audience: str, **forged: Any) -> str:
        """The token the metadata server of VM ``name`` (an instance of a group here) gives for ``audience``."""
        return self.google.token(audience, name, self.instance(name).id, project=self.project, zone=self.zone, **forged)

    # -- server

    async def start(self) -> str:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path, method = request.path, request.method
        self.requests.append((method, path))
        if self.unreachable:
            assert request.transport is not None
            request.transport.abort()  # no answer at all: the client sees the connection drop
            return web.Response(status=204)
        if path.startswith("/computeMetadata/v1/"):
            return self._metadata(request)
        if path == "/oauth2/v3/certs":
            return web.json_response(self.google.jwks())
        count, status, after = self._throttle
        if count > 0:
            self._throttle = (count - 1, status, after)
            return _throttled(status, after)
        body: Any = None
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return _error(400, "parseError", "Invalid JSON payload received.")
        zone = f"{API}/projects/{self.project}/zones/{self.zone}"
        if path.startswith(f"{zone}/instanceGroupManagers"):
            return self._groups(method, path.removeprefix(f"{zone}/instanceGroupManagers"), request, body)
        if path.startswith(f"{zone}/operations/") and method == "GET":
            return self._poll(path.rsplit("/", 1)[1])
        glob = f"{API}/projects/{self.project}/global"
        if path == f"{glob}/instanceTemplates" and method == "POST":
            return self._insert_template(body)
        if path.startswith(f"{glob}/instanceTemplates/") and method == "GET":
            found = self.templates.get(path.rsplit("/", 1)[1])
            return (
                web.json_response(found) if found else _error(404, "notFound", f"The resource '{path}' was not found")
            )
        if path.startswith(f"{glob}/operations/") and method == "GET":
            return self._poll(path.rsplit("/", 1)[1])
        return _error(404, "notFound", f"The resource '{path}' was not found")

    def _groups(self, method: str, rest: str, request: web.Request, body: Any) -> web.Response:
        if rest == "" and method == "POST":
            return self._insert_group(body)
        name, _, verb = rest.removeprefix("/").partition("/")
        group = self.groups.get(name)
        if group is None:
            where = f"projects/{self.project}/zones/{self.zone}/instanceGroupManagers/{name}"
            return _error(404, "notFound", f"The resource '{where}' was not found")
        if verb == "" and method == "GET":
            return web.json_response(self._group_json(group))
        if verb == "listManagedInstances" and method == "POST":
            return self._list(group, request)
        if verb in ("resize", "deleteInstances") and method == "POST" and self.fail_operations:
            kind = f"compute.instanceGroupManagers.{verb}"
            return self._operation(kind, lambda: None, group.name, error=dict(self.fail_operations))
        if verb == "resize" and method == "POST":
            size = request.query.get("size", "")
            if not size.isdigit():
                return _error(400, "invalid", f"Invalid value for field 'size': '{size}'")
            return self._resize(group, int(size))
        if verb == "deleteInstances" and method == "POST":
            return self._delete(group, body if isinstance(body, dict) else {})
        return _error(400, "badRequest", f"{method} {verb} is not served by the fake")

    def _list(self, group: FakeGroup, request: web.Request) -> web.Response:
        start = int(request.query.get("pageToken") or 0)
        instances = list(group.instances.values())
        page = instances[start : start + self.page_size]
        document: dict[str, Any] = {"managedInstances": [self._instance_json(i) for i in page]}
        if start + self.page_size < len(instances):
            document["nextPageToken"] = str(start + self.page_size)
        else:
            self._advance(group)  # the end of a listing: time passed for the group's own work
        return web.json_response(document)

    def _advance(self, group: FakeGroup) -> None:
        """The group's own work between two listings: recreate preempted VMs, (try to) create pending ones."""
        for instance in list(group.instances.values()):
            if instance.action == "RECREATING":
                instance.id, instance.status, instance.action = "", "", "CREATING"
            elif instance.action == "CREATING" and not self._creating(instance):
                self._create(instance)

    def _creating(self, instance: FakeInstance) -> bool:
        """Whether ``instance`` is still being created: the operation that asked for it has not ended."""
        return any(op.status == "RUNNING" and instance.name in op.target.split() for op in self.operations.values())

    def _create(self, instance: FakeInstance) -> None:
        if self.stockout:
            message = f"The zone '{self.zone}' does not have enough resources available to fulfill the request."
            instance.errors = [(self.stockout, message)]
            return
        instance.id, instance.status, instance.action, instance.errors = str(next(self._ids)), "RUNNING", "NONE", []

    def _resize(self, group: FakeGroup, size: int) -> web.Response:
        made = [self._new_instance(group) for _ in range(size - len(group.instances))]
        for extra in list(group.instances.values())[size:]:  # the group picks which ones go
            extra.action = "DELETING"
        group.target_size = size

        def done() -> None:
            for instance in made:
                if instance.action == "CREATING":
                    self._create(instance)
            for gone in [i for i in group.instances.values() if i.action == "DELETING"]:
                del group.instances[gone.name]

        return self._operation("compute.instanceGroupManagers.resize", done, " ".join(i.name for i in made))

    def _delete(self, group: FakeGroup, body: dict[str, Any]) -> web.Response:
        urls = body.get("instances")
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            return _error(400, "required", "Required field 'instances' not specified")
        names = [u.rsplit("/", 1)[-1] for u in urls]
        unknown = [n for n in names if n not in group.instances]
        if unknown and not body.get("skipInstancesOnValidationError"):
            return _error(400, "invalid", f"Instances {unknown} are not members of {group.name}")
        known = [group.instances[n] for n in names if n in group.instances]
        for instance in known:
            if instance.action != "DELETING":
                group.target_size -= 1
            instance.action = "DELETING"

        def done() -> None:
            for instance in known:
                group.instances.pop(instance.name, None)

        return self._operation("compute.instanceGroupManagers.deleteInstances", done, group.name)

    def _insert_template(self, body: Any) -> web.Response:
        problems = template_problems(body)
        if problems:
            return _error(400, "invalid", "; ".join(problems))
        name = body["name"]
        if name in self.templates:
            return _error(409, "alreadyExists", f"The resource 'global/instanceTemplates/{name}' already exists")
        url = f"{self.base_url}{API}/projects/{self.project}/global/instanceTemplates/{name}"
        self.templates[name] = {**body, "kind": "compute#instanceTemplate", "id": str(next(self._ids)), "selfLink": url}
        return self._operation("compute.instanceTemplates.insert", lambda: None, url, scope="global")

    def _insert_group(self, body: Any) -> web.Response:
        problems = group_problems(body, self.templates, self.project, self.zone)
        if problems:
            return _error(400, "invalid", "; ".join(problems))
        if body["name"] in self.groups:
            return _error(409, "alreadyExists", f"The resource '{body['name']}' already exists")
        template = template_name(body["instanceTemplate"], self.project) or ""
        group = self.groups[body["name"]] = FakeGroup(body["name"], body["baseInstanceName"], template)
        return self._resize(group, int(body.get("targetSize", 0)))

    def _new_instance(self, group: FakeGroup) -> FakeInstance:
        instance = FakeInstance(f"{group.base}-{next(self._names):04x}")
        group.instances[instance.name] = instance
        return instance

    def _operation(
        self, kind: str, done: Callable[[], None], target: str, scope: str = "", error: dict[str, str] | None = None
    ) -> web.Response:
        scope = scope or f"zones/{self.zone}"
        op = Operation(f"operation-{next(self._ids)}", kind, target, done, self.op_polls, scope, error)
        self.operations[op.name] = op
        if op.polls_left == 0:
            self._end(op)
        return web.json_response(self._operation_json(op))

    def _poll(self, name: str) -> web.Response:
        op = self.operations.get(name)
        if op is None:
            return _error(404, "notFound", f"The resource 'operations/{name}' was not found")
        if op.status == "RUNNING":
            op.polls_left -= 1
            if op.polls_left <= 0:
                self._end(op)
        return web.json_response(self._operation_json(op))

    def _end(self, op: Operation) -> None:
        op.status = "DONE"
        if op.error is None:
            op.done()

    def _operation_json(self, op: Operation) -> dict[str, Any]:
        document: dict[str, Any] = {
            "kind": "compute#operation",
            "id": op.name.split("-", 1)[1],
            "name": op.name,
            "operationType": op.kind.rsplit(".", 1)[1],
            "targetLink": f"{self.base_url}{API}/projects/{self.project}/{op.scope}",
            "status": op.status,
            "progress": 100 if op.status == "DONE" else 0,
            "selfLink": f"{self.base_url}{API}/projects/{self.project}/{op.scope}/operations/{op.name}",
        }
        if op.scope != "global":
            document["zone"] = f"{self.base_url}{API}/projects/{self.project}/{op.scope}"
        if op.error is not None and op.status == "DONE":
            document["error"] = {"errors": [op.error]}
            document["httpErrorStatusCode"], document["httpErrorMessage"] = 403, "FORBIDDEN"
        return document

    def _group_json(self, group: FakeGroup) -> dict[str, Any]:
        url = f"{self.base_url}{API}/projects/{self.project}/zones/{self.zone}"
        actions = [i.action for i in group.instances.values()]
        return {
            "kind": "compute#instanceGroupManager",
            "id": "77",
            "name": group.name,
            "zone": url,
            "baseInstanceName": group.base,
            "instanceTemplate": f"{self.base_url}{API}/projects/{self.project}/global/instanceTemplates/"
            + group.template,
            "targetSize": group.target_size,
            "currentActions": {a.lower(): actions.count(a) for a in sorted(set(actions))},
            "status": {"isStable": all(a == "NONE" for a in actions)},
            "selfLink": f"{url}/instanceGroupManagers/{group.name}",
        }

    def _instance_json(self, instance: FakeInstance) -> dict[str, Any]:
        url = f"{self.base_url}{API}/projects/{self.project}/zones/{self.zone}/instances/{instance.name}"
        document: dict[str, Any] = {"instance": url, "name": instance.name, "currentAction": instance.action}
        if instance.id:
            document["id"] = instance.id
        if instance.status:
            document["instanceStatus"] = instance.status
        if instance.errors:
            errors = [{"code": c, "message": m} for c, m in instance.errors]
            document["lastAttempt"] = {"errors": {"errors": errors}}
        return document

    def _metadata(self, request: web.Request) -> web.Response:
        if request.headers.get("Metadata-Flavor") != "Google" or self.metadata_instance is None:
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header.")
        headers = {"Metadata-Flavor": "Google"}
        path = request.path.removeprefix("/computeMetadata/v1/")
        if path == "instance/name":
            return web.Response(text=self.metadata_instance, headers=headers)
        if path == "instance/service-accounts/default/identity" and request.query.get("format") == "full":
            token = self.identity_token(self.metadata_instance, request.query.get("audience", ""))
            return web.Response(text=token, headers=headers)
        return web.Response(status=404, text="not found", headers=headers)


def _error(status: int, reason: str, message: str) -> web.Response:
    errors = [{"message": message, "domain": "global", "reason": reason}]
    return web.json_response({"error": {"code": status, "message": message, "errors": errors}}, status=status)


def _throttled(status: int, retry_after: int | None) -> web.Response:
    message = "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute'"
    domain = "usageLimits" if status == 403 else "global"
    error = {
        "code": status,
        "message": message,
        "errors": [{"message": message, "domain": domain, "reason": "rateLimitExceeded"}],
    }
    response = web.json_response({"error": error}, status=status)
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response
