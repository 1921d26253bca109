"""Pure pieces for reading what a metadata service says: it may say anything, so each either gives a value or
raises :class:`MetadataError` with a line that names what was wrong (never the hostile text itself in full)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# A notice's time far outside this window is a broken answer, not a plan, and must not reach the controller as a
# deadline (the same window as Azure's NotBefore: worker_agent.scheduled_events).
PAST_SECONDS = 86_400.0
AHEAD_SECONDS = 7 * 86_400.0
MAX_TIME_TEXT = 64


class MetadataError(RuntimeError):
    """The metadata service gave no usable answer."""


@dataclass(frozen=True)
class Unreadable:
    """An answer that could not be read: unlike an absent one (a 404), it withdraws nothing already known."""

    problem: str


def kind(value: object) -> str:
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


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """``body`` as a JSON object; anything else is a :class:`MetadataError` naming ``what`` it should have been."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, deep nesting
        raise MetadataError(f"{what} is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(payload, dict):
        raise MetadataError(f"{what} is {kind(payload)}, not an object")
    return payload


def iso_time(value: object, field: str, now: float) -> datetime:
    """An ISO 8601 time (``2026-11-29T01:02:03Z``) as an aware UTC datetime within a plausible window of ``now``
    (epoch seconds); a time without a zone is taken as UTC, as AWS writes every time in UTC."""
    if not isinstance(value, str) or not value or len(value) > MAX_TIME_TEXT:
        raise MetadataError(f"{field} is {kind(value)}, not a time")
    try:
        parsed = datetime.fromisoformat(value)
        at = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        seconds = at.timestamp()
    except (ValueError, OverflowError) as exc:
        raise MetadataError(f"{field} {value!r} is not an ISO 8601 time") from exc
    if not now - PAST_SECONDS <= seconds <= now + AHEAD_SECONDS:
        raise MetadataError(f"{field} {value!r} is {seconds - now:.0f} s from now, not a plausible notice")
    return at
