"""Spot-availability traces in the three shapes users bring, read into one form.

- events, one a line: ``milliseconds_since_start,add|remove,node_name`` (Bamboo's traces);
- counts per fixed interval, JSON: ``{"metadata": {"gap_seconds": N}, "data": [counts]}`` (SkyPilot);
- timestamped counts, one a line: ``YYYY-MM-DD, HH:MM[:SS], count``.

The shape is detected from the text. Counts become add/remove events of synthetic nodes
(``node-1``, ``node-2``, ...; the most recently added leaves first), so every policy sees events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from morphing.errors import UserInputError


@dataclass(frozen=True)
class TraceEvent:
    seconds: float
    kind: Literal["add", "remove"]
    node: str


@dataclass(frozen=True)
class Trace:
    events: tuple[TraceEvent, ...]
    shape: str

    @property
    def duration_seconds(self) -> float:
        return self.events[-1].seconds if self.events else 0.0

    def availability(self) -> list[tuple[float, int]]:
        """``(seconds, nodes available from then on)`` after every event."""
        live: set[str] = set()
        out = []
        for event in self.events:
            if event.kind == "add":
                live.add(event.node)
            else:
                live.discard(event.node)
            out.append((event.seconds, len(live)))
        return out


def parse_trace(text: str, what: str = "trace") -> Trace:
    stripped = text.strip()
    if not stripped:
        raise UserInputError(f"{what} is empty; give events (ms,add|remove,node), JSON counts or dated counts")
    if stripped.startswith("{"):
        return _from_counts_json(stripped, what)
    first = next(line for line in stripped.splitlines() if line.strip() and not line.startswith("#"))
    parts = [p.strip() for p in first.split(",")]
    if len(parts) == 3 and parts[1] in ("add", "remove"):
        return _from_events(stripped, what)
    if len(parts) == 3:
        return _from_dated_counts(stripped, what)
    raise UserInputError(
        f"{what}: cannot tell the format from its first line {first!r}; expected 'ms,add|remove,node', "
        "'date, time, count' or a JSON object with metadata.gap_seconds and data"
    )


def _lines(text: str) -> list[tuple[int, list[str]]]:
    return [
        (number, [p.strip() for p in line.split(",")])
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _from_events(text: str, what: str) -> Trace:
    events: list[TraceEvent] = []
    live: set[str] = set()
    for number, parts in _lines(text):
        if len(parts) != 3 or parts[1] not in ("add", "remove") or not parts[2]:
            raise UserInputError(f"{what} line {number}: expected 'ms,add|remove,node', got {','.join(parts)!r}")
        try:
            millis = float(parts[0])
        except ValueError:
            raise UserInputError(f"{what} line {number}: {parts[0]!r} is not a time in milliseconds") from None
        if events and millis < events[-1].seconds * 1000:
            raise UserInputError(f"{what} line {number}: time goes backwards; sort the trace by time")
        kind: Literal["add", "remove"] = "add" if parts[1] == "add" else "remove"
        if kind == "remove" and parts[2] not in live:
            continue
        if kind == "add" and parts[2] in live:
            continue
        (live.add if kind == "add" else live.discard)(parts[2])
        events.append(TraceEvent(millis / 1000.0, kind, parts[2]))
    return Trace(tuple(events), "events")


def _counts_to_events(points: list[tuple[float, int]]) -> tuple[TraceEvent, ...]:
    events: list[TraceEvent] = []
    live: list[str] = []
    serial = 0
    for seconds, count in points:
        while len(live) < count:
            serial += 1
            live.append(f"node-{serial}")
            events.append(TraceEvent(seconds, "add", live[-1]))
        while len(live) > count:
            events.append(TraceEvent(seconds, "remove", live.pop()))
    return tuple(events)


def _from_counts_json(text: str, what: str) -> Trace:
    try:
        data = json.loads(text)
        gap = float(data["metadata"]["gap_seconds"])
        counts = [int(c) for c in data["data"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UserInputError(
            f"{what}: a JSON trace needs metadata.gap_seconds and a data list of counts ({exc})"
        ) from None
    if gap <= 0 or any(c < 0 for c in counts):
        raise UserInputError(f"{what}: gap_seconds must be > 0 and counts >= 0")
    return Trace(_counts_to_events([(i * gap, c) for i, c in enumerate(counts)]), "counts-json")


def _from_dated_counts(text: str, what: str) -> Trace:
    points: list[tuple[float, int]] = []
    start: datetime | None = None
    for number, parts in _lines(text):
        try:
            when = datetime.fromisoformat(f"{parts[0]} {parts[1]}")
            count = int(parts[2])
        except (ValueError, IndexError):
            raise UserInputError(f"{what} line {number}: expected 'YYYY-MM-DD, HH:MM:SS, count'") from None
        if count < 0:
            raise UserInputError(f"{what} line {number}: count {count} must be >= 0")
        start = start or when
        seconds = (when - start).total_seconds()
        if points and seconds < points[-1][0]:
            raise UserInputError(f"{what} line {number}: time goes backwards; sort the trace by time")
        points.append((seconds, count))
    return Trace(_counts_to_events(points), "dated-counts")
