"""Eviction notices from Azure's Scheduled Events (the Instance Metadata Service, IMDS).

Azure announces a Spot eviction as a ``Preempt`` event (``Terminate`` for a scale-in) at
``GET {base}/metadata/scheduledevents?api-version=2020-07-01`` with the header ``Metadata: true``,
usually 30 s before ``NotBefore``. The document carries a ``DocumentIncarnation`` that changes
whenever its events change, so a poller only needs to look at a document whose incarnation it has
not seen. An event's ``EventStatus`` is ``Scheduled`` or ``Started``; a cancelled or finished event
leaves the document. After the checkpoint is committed the agent may acknowledge an event with
``POST {"StartRequests": [{"EventId": ...}]}`` so that Azure need not wait for ``NotBefore``.

The service may answer with anything, slowly, or not at all, and none of it may stop eviction
watching: :func:`parse_body` and :func:`parse_document` are pure and take each event on its own
(a malformed one is skipped with a warning), :class:`EvictionWatcher` turns documents into facts,
:class:`ScheduledEventsClient` is the thin HTTP shell (one deadline per request, a capped body) and
:class:`EvictionPoller` is one poll that never raises.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from worker_agent.deadline_http import RequestFailed, request
from worker_agent.notices.facts import EvictionNoticed as EvictionNoticed  # the facts every cloud's source gives
from worker_agent.notices.facts import EvictionWithdrawn as EvictionWithdrawn
from worker_agent.notices.facts import Fact as Fact

log = logging.getLogger("spotmorph.agent.imds")

API_VERSION = "2020-07-01"
EVICTION_TYPES = frozenset({"Preempt", "Terminate"})
ACTIVE_STATUSES = frozenset({"Scheduled", "Started"})
DEFAULT_BASE_URL = "http://169.254.169.254"
MAX_BODY_BYTES = 1 << 20
# Azure gives at most about 15 minutes of notice; a NotBefore far outside this window is a broken
# document, not a plan, and must not reach the controller as a deadline.
NOT_BEFORE_PAST_SECONDS = 86_400.0
NOT_BEFORE_AHEAD_SECONDS = 7 * 86_400.0
MAX_TEXT = 256
MAX_WARNINGS = 20


class ScheduledEventsError(RuntimeError):
    """The metadata service gave no usable Scheduled Events document."""


class _Malformed(ValueError):
    """One event cannot be used; the rest of the document still can."""


@dataclass(frozen=True)
class ScheduledEvent:
    event_id: str
    event_type: str
    resources: tuple[str, ...]
    status: str
    not_before: datetime | None  # timezone-aware UTC, within the window above
    description: str = ""


@dataclass(frozen=True)
class ScheduledEventsDocument:
    incarnation: int
    events: tuple[ScheduledEvent, ...]
    # Ids of events skipped as malformed: an unreadable event has not vanished, so it withdraws nothing.
    skipped_ids: frozenset[str] = frozenset()
    warnings: tuple[str, ...] = ()


def parse_body(body: bytes, now: float) -> ScheduledEventsDocument:
    """The document in an HTTP body; raises only :class:`ScheduledEventsError`."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, deep nesting
        raise ScheduledEventsError(f"not JSON: {str(exc)[:200]}") from exc
    return parse_document(payload, now)


def parse_document(payload: Any, now: float) -> ScheduledEventsDocument:
    """A document from decoded JSON, ``now`` in epoch seconds. Each event is parsed on its own, so one
    malformed event costs only itself; raises only :class:`ScheduledEventsError`, when the document as
    a whole is unusable (then nothing in it may be read as an event having left)."""
    if not isinstance(payload, dict):
        raise ScheduledEventsError(f"not a Scheduled Events document but {_kind(payload)}")
    incarnation = payload.get("DocumentIncarnation")
    if isinstance(incarnation, bool) or not isinstance(incarnation, int) or not 0 <= incarnation < 2**63:
        raise ScheduledEventsError(f"DocumentIncarnation is {_kind(incarnation)}, not a non-negative integer")
    raw_events = payload.get("Events")
    if not isinstance(raw_events, list):
        raise ScheduledEventsError(f"Events is {_kind(raw_events)}, not an array")
    events: list[ScheduledEvent] = []
    skipped: set[str] = set()
    warnings: list[str] = []
    for index, raw in enumerate(raw_events):
        try:
            events.append(_event(raw, now))
        except _Malformed as exc:
            event_id = raw.get("EventId") if isinstance(raw, dict) else None
            named = ""
            if isinstance(event_id, str) and 0 < len(event_id) <= MAX_TEXT:
                skipped.add(event_id)
                named = f" {event_id[:64]!r}"
            warnings.append(f"event {index}{named} skipped: {exc}")
    if len(warnings) > MAX_WARNINGS:
        warnings[MAX_WARNINGS:] = [f"and {len(warnings) - MAX_WARNINGS} more malformed events"]
    return ScheduledEventsDocument(incarnation, tuple(events), frozenset(skipped), tuple(warnings))


def _event(raw: object, now: float) -> ScheduledEvent:
    if not isinstance(raw, dict):
        raise _Malformed(f"it is {_kind(raw)}, not an object")
    resources = raw.get("Resources")
    if resources is None:
        resources = []
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise _Malformed(f"Resources is {_kind(resources)}, not an array of names")
    description = raw.get("Description")
    return ScheduledEvent(
        event_id=_text(raw, "EventId"),
        event_type=_text(raw, "EventType"),
        resources=tuple(resources),
        status=_text(raw, "EventStatus", default="Scheduled"),
        not_before=_not_before(raw.get("NotBefore"), now),
        description=description[:1000] if isinstance(description, str) else "",
    )


def _text(raw: dict[str, object], key: str, default: str | None = None) -> str:
    value = raw.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or not value:
        raise _Malformed(f"{key} is {_kind(value)}, not a non-empty string")
    if len(value) > MAX_TEXT:
        raise _Malformed(f"{key} is longer than {MAX_TEXT} characters")
    return value


def _not_before(value: object, now: float) -> datetime | None:
    """``NotBefore`` is an RFC 1123 date, empty once the event has started."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 64:
        raise _Malformed(f"NotBefore is {_kind(value)}, not a date")
    try:
        parsed = parsedate_to_datetime(value)
        # RFC 2822's "-0000" gives a naive datetime: the zone is unknown, and UTC is the best guess.
        at = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        seconds = at.timestamp()
    except (TypeError, ValueError, OverflowError, IndexError) as exc:
        raise _Malformed(f"NotBefore {value[:64]!r} is not a date") from exc
    if not now - NOT_BEFORE_PAST_SECONDS <= seconds <= now + NOT_BEFORE_AHEAD_SECONDS:
        raise _Malformed(f"NotBefore {value[:64]!r} is {seconds - now:.0f} s from now, not a plausible notice")
    return at


def _kind(value: object) -> str:
    """What a JSON value is, without printing it (it may be huge or deeply nested)."""
    if value is None:
        return "missing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string" if value else "empty"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


@dataclass
class EvictionWatcher:
    """Turns successive documents into eviction facts for one VM, each reported once. Withdrawals come
    first, and after one the evictions still standing are reported again, so a consumer that keeps one
    notice at a time moves on to the next."""

    vm_name: str
    incarnation: int | None = None
    known: dict[str, EvictionNoticed] = field(default_factory=dict)  # event id -> last notice reported

    def observe(self, document: ScheduledEventsDocument) -> list[Fact]:
        if not self.vm_name or document.incarnation == self.incarnation:
            return []  # without a name nothing is ours yet: the document is looked at again once there is one
        self.incarnation = document.incarnation
        current: dict[str, EvictionNoticed] = {}
        inactive: dict[str, str] = {}
        for event in document.events:
            if event.event_type not in EVICTION_TYPES or self.vm_name not in event.resources:
                continue
            if event.status in ACTIVE_STATUSES:
                current[event.event_id] = EvictionNoticed(
                    event.event_id, event.event_type, event.status, event.not_before
                )
            else:
                inactive[event.event_id] = event.status
        present = {event.event_id for event in document.events}
        withdrawn: list[Fact] = []
        for event_id, notice in self.known.items():
            if event_id in current:
                continue
            if event_id in inactive:
                withdrawn.append(EvictionWithdrawn(event_id, f"its status is {inactive[event_id][:64]!r}"))
            elif event_id in document.skipped_ids:
                current[event_id] = notice
            elif event_id in present:
                withdrawn.append(EvictionWithdrawn(event_id, "it no longer evicts this VM"))
            else:
                withdrawn.append(EvictionWithdrawn(event_id, "it left the document"))
        noticed = [n for i, n in current.items() if withdrawn or self.known.get(i) != n]
        self.known = current
        return [*withdrawn, *noticed]


class ScheduledEventsClient:
    """Blocking HTTP calls to the metadata service; run them in a thread from async code. One deadline
    covers each whole request and the body is capped, because a notice is only about 30 s long."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        timeout_seconds: float = 2.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = f"{base_url.rstrip('/')}/metadata/scheduledevents?api-version={API_VERSION}"
        self.timeout = timeout_seconds
        self.max_body_bytes = max_body_bytes
        self.clock = clock
        self.wall_clock = wall_clock

    def _request(self, method: str, body: bytes | None = None) -> bytes:
        headers = {"Metadata": "true"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return request(
            self.url,
            method=method,
            headers=headers,
            body=body,
            timeout=self.timeout,
            max_body_bytes=self.max_body_bytes,
            clock=self.clock,
        )

    def fetch(self) -> ScheduledEventsDocument:
        """The current document; raises only :class:`ScheduledEventsError`."""
        try:
            body = self._request("GET")
        except RequestFailed as exc:
            raise ScheduledEventsError(f"metadata service at {self.url}: {exc}") from exc
        return parse_body(body, self.wall_clock())

    def acknowledge(self, event_id: str) -> None:
        """``StartRequests`` for ``event_id``: tells Azure the VM is ready to go now."""
        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        try:
            self._request("POST", body)
        except RequestFailed as exc:
            raise ScheduledEventsError(f"acknowledging event {event_id} failed: {exc}") from exc


class EvictionPoller:
    """One look at the metadata service, facts out. It never raises, so the loop that calls it outlives
    any answer; each new problem is logged as a warning, its repeats (one a poll) only at debug level."""

    def __init__(self, client: ScheduledEventsClient, watcher: EvictionWatcher) -> None:
        self.client = client
        self.watcher = watcher
        self._last_problems: tuple[str, ...] = ()

    def poll(self) -> list[Fact]:
        try:
            document = self.client.fetch()
        except ScheduledEventsError as exc:
            self._log((str(exc),))
            return []
        except Exception as exc:  # a bug here must not end eviction watching for good
            log.warning("scheduled events: unexpected %s", type(exc).__name__, exc_info=True)
            self._last_problems = ()
            return []
        self._log(document.warnings)
        return self.watcher.observe(document)

    def _log(self, problems: tuple[str, ...]) -> None:
        level = logging.DEBUG if problems == self._last_problems else logging.WARNING
        for problem in problems:
            log.log(level, "scheduled events: %s", problem)
        self._last_problems = problems


def seconds_until(not_before: datetime | None, now: float) -> float | None:
    """Seconds from ``now`` (epoch seconds) to ``not_before``; ``None`` when there is no deadline."""
    if not_before is None:
        return None
    return (not_before - datetime.fromtimestamp(now, UTC)) / timedelta(seconds=1)
