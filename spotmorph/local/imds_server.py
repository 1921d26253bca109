"""A local Scheduled Events service that follows Microsoft's documented IMDS schema.

The local cluster serves eviction notices through it (``spotmorph local preempt NODE --notice 30``),
and tests point agents at it, so the agent's IMDS code path is the one that runs on Azure.

- ``GET /metadata/scheduledevents?api-version=...`` with ``Metadata: true`` returns
  ``{"DocumentIncarnation": n, "Events": [...]}``; without the header: 400, as IMDS does.
- ``POST`` of ``{"StartRequests": [{"EventId": ...}]}`` starts those events (status ``Started``).
- An event also starts by itself once its ``NotBefore`` has passed.
- Admin (not part of IMDS): ``POST /admin/events`` ``{"EventType", "Resources", "NoticeSeconds"}``
  schedules an event and returns its id; ``DELETE /admin/events/ID`` removes it;
  ``GET /admin/events`` lists events with whether they were acknowledged.
Every change bumps ``DocumentIncarnation``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

EVENT_TYPES = ("Reboot", "Redeploy", "Freeze", "Preempt", "Terminate")


@dataclass(frozen=True)
class _Event:
    event_id: str
    event_type: str
    resources: tuple[str, ...]
    not_before: datetime
    status: str = "Scheduled"
    acknowledged: bool = False
    description: str = ""

    def to_imds(self) -> dict[str, Any]:
        return {
            "EventId": self.event_id,
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(self.resources),
            "EventStatus": self.status,
            "NotBefore": format_datetime(self.not_before, usegmt=True) if self.status == "Scheduled" else "",
            "Description": self.description,
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }


class ScheduledEventsState:
    """The events document; thread-safe, with an injected clock (``() -> seconds since the epoch``)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._events: dict[str, _Event] = {}
        self.incarnation = 1

    def schedule(self, event_type: str, resources: list[str], notice_seconds: float, description: str = "") -> str:
        if event_type not in EVENT_TYPES:
            raise ValueError(f"EventType {event_type!r}; use one of {', '.join(EVENT_TYPES)}")
        if not resources or not all(isinstance(r, str) and r for r in resources):
            raise ValueError("Resources must be a non-empty list of VM names")
        if notice_seconds < 0:
            raise ValueError("NoticeSeconds must be >= 0")
        event_id = str(uuid.uuid4()).upper()
        not_before = datetime.fromtimestamp(self._clock() + notice_seconds, UTC).replace(microsecond=0)
        with self._lock:
            self._events[event_id] = _Event(event_id, event_type, tuple(resources), not_before, description=description)
            self.incarnation += 1
        return event_id

    def remove(self, event_id: str) -> bool:
        with self._lock:
            if self._events.pop(event_id, None) is None:
                return False
            self.incarnation += 1
            return True

    def start(self, event_ids: list[str]) -> None:
        with self._lock:
            changed = False
            for event_id in event_ids:
                event = self._events.get(event_id)
                if event is not None and not event.acknowledged:
                    self._events[event_id] = replace(event, status="Started", acknowledged=True)
                    changed = True
            if changed:
                self.incarnation += 1

    def document(self) -> dict[str, Any]:
        now = datetime.fromtimestamp(self._clock(), UTC)
        with self._lock:
            due = [e for e in self._events.values() if e.status == "Scheduled" and e.not_before <= now]
            for event in due:
                self._events[event.event_id] = replace(event, status="Started")
            if due:
                self.incarnation += 1
            return {
                "DocumentIncarnation": self.incarnation,
                "Events": [e.to_imds() for e in self._events.values()],
            }

    def admin_view(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**e.to_imds(), "Acknowledged": e.acknowledged} for e in self._events.values()]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _imds_ok(self) -> bool:
        url = urlparse(self.path)
        if url.path.rstrip("/") != "/metadata/scheduledevents":
            self._send(404, {"error": "Not found"})
            return False
        if self.headers.get("Metadata", "").lower() != "true":
            self._send(400, {"error": "Bad request. Required metadata header not specified"})
            return False
        if "api-version" not in parse_qs(url.query):
            self._send(400, {"error": "Bad request. api-version was not specified in the request"})
            return False
        return True

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/admin/events":
            self._send(200, self.server.state.admin_view())
        elif self._imds_ok():
            self._send(200, self.server.state.document())

    def do_POST(self) -> None:
        try:
            body = self._body()
        except (json.JSONDecodeError, ValueError):
            self._send(400, {"error": "Bad request. The body is not JSON"})
            return
        if self.path.rstrip("/") == "/admin/events":
            try:
                event_id = self.server.state.schedule(
                    str(body.get("EventType", "Preempt")),
                    list(body.get("Resources") or []),
                    float(body.get("NoticeSeconds", 30)),
                    str(body.get("Description", "")),
                )
            except (ValueError, TypeError) as exc:
                self._send(400, {"error": str(exc)})
                return
            self._send(201, {"EventId": event_id})
        elif self._imds_ok():
            requests = body.get("StartRequests") if isinstance(body, dict) else None
            if not isinstance(requests, list):
                self._send(400, {"error": "Bad request. StartRequests is required"})
                return
            self.server.state.start([str(r.get("EventId")) for r in requests if isinstance(r, dict)])
            self._send(200, {})

    def do_DELETE(self) -> None:
        prefix = "/admin/events/"
        if self.path.startswith(prefix) and self.server.state.remove(self.path[len(prefix) :]):
            self._send(200, {})
        else:
            self._send(404, {"error": "no such event"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: ScheduledEventsState) -> None:
        super().__init__(address, _Handler)
        self.state = state


class ScheduledEventsServer:
    """The service on ``host:port`` (port 0 picks a free one) in a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, state: ScheduledEventsState | None = None) -> None:
        self.state = state or ScheduledEventsState()
        self._server = _Server((host, port), self.state)
        self._thread = threading.Thread(target=self._server.serve_forever, name="scheduled-events", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ScheduledEventsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def serve_forever(self) -> None:
        self._server.serve_forever()
