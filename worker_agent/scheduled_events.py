"""Eviction notices from Azure's Scheduled Events (the Instance Metadata Service, IMDS).

Azure announces a Spot eviction as a ``Preempt`` event (``Terminate`` for a scale-in) at
``GET {base}/metadata/scheduledevents?api-version=2020-07-01`` with the header ``Metadata: true``,
usually 30 s before ``NotBefore``. The document carries a ``DocumentIncarnation`` that changes
whenever its events change, so a poller only needs to look at a document whose incarnation it has
not seen. After the checkpoint is committed the agent may acknowledge an event with
``POST {"StartRequests": [{"EventId": ...}]}`` so that Azure need not wait for ``NotBefore``.

:class:`EvictionWatcher` is the pure part (document in, facts out); :class:`ScheduledEventsClient`
is the thin HTTP shell (stdlib only, called from a thread).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

API_VERSION = "2020-07-01"
EVICTION_TYPES = frozenset({"Preempt", "Terminate"})
DEFAULT_BASE_URL = "http://169.254.169.254"


class ScheduledEventsError(RuntimeError):
    """The metadata service answered with something that is not a Scheduled Events document."""


@dataclass(frozen=True)
class ScheduledEvent:
    event_id: str
    event_type: str
    resources: tuple[str, ...]
    status: str
    not_before: datetime | None
    description: str = ""


@dataclass(frozen=True)
class ScheduledEventsDocument:
    incarnation: int
    events: tuple[ScheduledEvent, ...]


@dataclass(frozen=True)
class EvictionNoticed:
    """An eviction of this VM was announced (or its status changed, e.g. to ``Started``)."""

    event_id: str
    event_type: str
    status: str
    not_before: datetime | None


@dataclass(frozen=True)
class EvictionWithdrawn:
    """An announced eviction vanished from the document (done, or cancelled by the platform)."""

    event_id: str


def parse_document(payload: Any) -> ScheduledEventsDocument:
    """A document from the decoded JSON body; raises :class:`ScheduledEventsError` on a bad shape."""
    if not isinstance(payload, dict) or "DocumentIncarnation" not in payload:
        raise ScheduledEventsError(f"not a Scheduled Events document: {str(payload)[:200]}")
    events = []
    for raw in payload.get("Events") or []:
        try:
            not_before_text = raw.get("NotBefore") or ""
            events.append(
                ScheduledEvent(
                    event_id=str(raw["EventId"]),
                    event_type=str(raw["EventType"]),
                    resources=tuple(str(r) for r in raw.get("Resources") or ()),
                    status=str(raw.get("EventStatus", "Scheduled")),
                    not_before=parsedate_to_datetime(not_before_text) if not_before_text else None,
                    description=str(raw.get("Description", "")),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduledEventsError(f"malformed event {raw!r}: {exc}") from exc
    try:
        incarnation = int(payload["DocumentIncarnation"])
    except (TypeError, ValueError) as exc:
        raise ScheduledEventsError(f"bad DocumentIncarnation {payload['DocumentIncarnation']!r}") from exc
    return ScheduledEventsDocument(incarnation, tuple(events))


@dataclass
class EvictionWatcher:
    """Turns successive documents into eviction facts for one VM, each reported once."""

    vm_name: str
    incarnation: int | None = None
    known: dict[str, str] = field(default_factory=dict)  # event id -> last status reported

    def observe(self, document: ScheduledEventsDocument) -> list[EvictionNoticed | EvictionWithdrawn]:
        if document.incarnation == self.incarnation:
            return []
        self.incarnation = document.incarnation
        facts: list[EvictionNoticed | EvictionWithdrawn] = []
        current: dict[str, str] = {}
        for event in document.events:
            if event.event_type not in EVICTION_TYPES or self.vm_name not in event.resources:
                continue
            current[event.event_id] = event.status
            if self.known.get(event.event_id) != event.status:
                facts.append(EvictionNoticed(event.event_id, event.event_type, event.status, event.not_before))
        facts.extend(EvictionWithdrawn(event_id) for event_id in self.known if event_id not in current)
        self.known = current
        return facts


class ScheduledEventsClient:
    """Blocking HTTP calls to the metadata service; run them in a thread from async code."""

    def __init__(self, base_url: str = DEFAULT_BASE_URL, timeout_seconds: float = 2.0) -> None:
        self.url = f"{base_url.rstrip('/')}/metadata/scheduledevents?api-version={API_VERSION}"
        self.timeout = timeout_seconds

    def fetch(self) -> ScheduledEventsDocument:
        request = urllib.request.Request(self.url, headers={"Metadata": "true"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ScheduledEventsError(f"metadata service unreachable at {self.url}: {exc}") from exc
        try:
            return parse_document(json.loads(body))
        except json.JSONDecodeError as exc:
            raise ScheduledEventsError(f"metadata service sent invalid JSON: {exc}") from exc

    def acknowledge(self, event_id: str) -> None:
        """``StartRequests`` for ``event_id``: tells Azure the VM is ready to go now."""
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Metadata": "true", "Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ScheduledEventsError(f"acknowledging event {event_id} failed: {exc}") from exc


def seconds_until(not_before: datetime | None, now: float) -> float | None:
    """Seconds from ``now`` (epoch seconds) to ``not_before``; ``None`` when there is no deadline."""
    if not_before is None:
        return None
    return (not_before - datetime.fromtimestamp(now, UTC)) / timedelta(seconds=1)
