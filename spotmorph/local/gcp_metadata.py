"""A local GCP metadata server for the local cluster's VMs: each one's ``instance/preempted``.

The local cluster started with ``--cloud gcp`` serves its preemptions through it, so the agent's GCP code path is
the one that runs on Compute Engine. Each VM's metadata lives under ``/VM`` (:mod:`.metadata_http`):

- ``GET /VM/computeMetadata/v1/instance/preempted`` needs ``Metadata-Flavor: Google`` (403 without, as GCP
  answers) and answers ``TRUE`` or ``FALSE`` with ``Metadata-Flavor: Google`` and an ``ETag`` that changes with
  the value; with ``wait_for_change=true`` it hangs until the ETag differs from ``last_etag`` (or from the current
  one, without it), at most ``timeout_sec`` seconds (default and cap :data:`MAX_HANG_SECONDS`).
- Admin (not GCP's): ``POST /admin/preempt`` ``{"vm", "notice_seconds"}`` preempts a VM (``TRUE`` at once, the VM
  stopped ``notice_seconds`` later); ``DELETE /admin/preempt/VM`` makes it ``FALSE`` again; ``GET /admin/state``.

The platform (:mod:`.platform`) also does what GCP's ACPI shutdown does: the preempted VM's agent gets a SIGTERM
at once, and the VM is stopped once its agent has exited or the notice is up.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from spotmorph.local.metadata_http import Handler, Serving, seconds, vm_name

PREEMPTED = "/computeMetadata/v1/instance/preempted"
FLAVOR_HEADER = "Metadata-Flavor"
FLAVOR = "Google"
MAX_HANG_SECONDS = 300.0
MAX_NOTICE = 86_400.0


@dataclass(frozen=True)
class Preemption:
    preempted: bool
    etag: str
    stop_at: float | None = None  # epoch seconds when the VM stops (None: not preempted)
    signalled: bool = False  # its agent got the shutdown's SIGTERM


class GcpMetadataState:
    """Every VM's ``preempted`` and ETag; thread-safe (a change wakes the hanging GETs), the clock injected."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._changed = threading.Condition()
        self._vms: dict[str, Preemption] = {}
        self._serial = 0
        self._closing = False

    def _etag(self) -> str:
        self._serial += 1
        return f"{self._serial:016x}"

    def current(self, vm: str) -> Preemption:
        with self._changed:
            return self._current(vm)

    def _current(self, vm: str) -> Preemption:
        if vm not in self._vms:
            self._vms[vm] = Preemption(False, self._etag())
        return self._vms[vm]

    def preempt(self, vm: str, notice_seconds: float) -> float:
        """``vm`` is preempted now and stops ``notice_seconds`` later (returned, in epoch seconds)."""
        with self._changed:
            now = self._clock()
            before = self._current(vm)
            if before.preempted and before.stop_at is not None:
                return before.stop_at
            self._vms[vm] = Preemption(True, self._etag(), now + notice_seconds)
            self._changed.notify_all()
            return now + notice_seconds

    def restore(self, vm: str) -> bool:
        """``preempted`` is FALSE again (a VM started anew)."""
        with self._changed:
            if not self._current(vm).preempted:
                return False
            self._vms[vm] = Preemption(False, self._etag())
            self._changed.notify_all()
            return True

    def wait_change(self, vm: str, last_etag: str | None, timeout: float) -> Preemption:
        """The value once its ETag differs from ``last_etag`` (None: from the current one), or after ``timeout``."""
        with self._changed:
            since = last_etag if last_etag is not None else self._current(vm).etag
            self._changed.wait_for(lambda: self._closing or self._current(vm).etag != since, timeout)
            return self._current(vm)

    def mark_signalled(self, vm: str) -> None:
        with self._changed:
            self._vms[vm] = replace(self._current(vm), signalled=True)

    def preempted(self) -> dict[str, Preemption]:
        with self._changed:
            return {vm: p for vm, p in self._vms.items() if p.preempted}

    def forget(self, vm: str) -> None:
        """``vm`` is gone; should it come back it starts unpreempted."""
        with self._changed:
            self._vms.pop(vm, None)

    def close(self) -> None:
        """Release every hanging GET (the server is stopping)."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()

    def view(self) -> dict[str, dict[str, Any]]:
        with self._changed:
            return {vm: {"preempted": p.preempted, "etag": p.etag, "stop_at": p.stop_at} for vm, p in self._vms.items()}


class _GcpHandler(Handler):
    server: Any

    @property
    def state(self) -> GcpMetadataState:
        state: GcpMetadataState = self.server.state
        return state

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/admin/state":
            self.send_json(200, self.state.view())
            return
        where = self.split_vm()
        if where is None or where[1] != PREEMPTED:
            self.send_text(404, "Not Found", {FLAVOR_HEADER: FLAVOR})
            return
        if self.headers.get(FLAVOR_HEADER) != FLAVOR:
            self.send_text(403, "Missing Metadata-Flavor:Google header.", {FLAVOR_HEADER: FLAVOR})
            return
        query = parse_qs(urlsplit(self.path).query)
        vm = where[0]
        if query.get("wait_for_change", [""])[0].lower() == "true":
            try:
                hang = float(query.get("timeout_sec", [MAX_HANG_SECONDS])[0])
            except ValueError:
                hang = math.nan
            if not hang >= 0:
                self.send_text(400, "timeout_sec must be a number of seconds", {FLAVOR_HEADER: FLAVOR})
                return
            value = self.state.wait_change(vm, query.get("last_etag", [None])[0], min(hang, MAX_HANG_SECONDS))
        else:
            value = self.state.current(vm)
        headers = {FLAVOR_HEADER: FLAVOR, "ETag": value.etag}
        self.send(200, b"TRUE" if value.preempted else b"FALSE", "application/text", headers)

    def do_POST(self) -> None:
        body = self.json_object()
        if body is None:
            return
        if self.path != "/admin/preempt":
            self.send_json(404, {"error": "no such admin endpoint"})
            return
        try:
            vm = vm_name(body.get("vm"))
            stop_at = self.state.preempt(vm, seconds(body.get("notice_seconds", 30), "notice_seconds", MAX_NOTICE))
        except ValueError as exc:
            self.send_json(400, {"error": str(exc)})
            return
        self.send_json(201, {"vm": vm, "stop_at": stop_at})

    def do_DELETE(self) -> None:
        prefix = "/admin/preempt/"
        if self.path.startswith(prefix) and self.state.restore(self.path[len(prefix) :]):
            self.send_json(200, {})
        else:
            self.send_json(404, {"error": "no such preemption"})


class GcpMetadataServer(Serving):
    """The service on ``host:port`` (port 0 picks a free one) in a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, state: GcpMetadataState | None = None) -> None:
        self.state = state or GcpMetadataState()
        super().__init__(host, port, _GcpHandler, self.state, "gcp-metadata")

    def start(self) -> GcpMetadataServer:
        self.start_serving()
        return self

    def stop(self) -> None:
        self.state.close()
        super().stop()
