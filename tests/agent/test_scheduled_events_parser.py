"""The pure half of the IMDS path: hostile documents in, typed events and warnings (or one error type) out."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_agent.scheduled_events import (
    ACTIVE_STATUSES,
    EVICTION_TYPES,
    MAX_WARNINGS,
    NOT_BEFORE_AHEAD_SECONDS,
    NOT_BEFORE_PAST_SECONDS,
    EvictionNoticed,
    EvictionWatcher,
    EvictionWithdrawn,
    Fact,
    ScheduledEventsDocument,
    ScheduledEventsError,
    parse_body,
    parse_document,
)

NOW = 1_800_000_000.0
VM = "node-1"
FIELDS = ["DocumentIncarnation", "Events", "EventId", "EventType", "Resources", "EventStatus", "NotBefore"]


def rfc1123(epoch: float) -> str:
    return format_datetime(datetime.fromtimestamp(epoch, UTC), usegmt=True)


def event(event_id: str = "E1", event_type: str = "Preempt", **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "EventId": event_id,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "EventStatus": "Scheduled",
        "NotBefore": rfc1123(NOW + 30),
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    raw.update(overrides)
    return raw


def document(incarnation: int, *events: Any) -> dict[str, Any]:
    return {"DocumentIncarnation": incarnation, "Events": list(events)}


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30)
)
json_keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(json_keys, inner, max_size=6)),
    max_leaves=25,
)
field_values = st.one_of(json_values, st.just(VM).map(lambda v: [v]), st.sampled_from(["Preempt", "not a date"]))
event_like = st.one_of(json_values, st.fixed_dictionaries({}, optional=dict.fromkeys(FIELDS[2:], field_values)))
document_like = st.fixed_dictionaries(
    {"DocumentIncarnation": st.one_of(st.integers(min_value=-3, max_value=2**64), json_values)},
    optional={"Events": st.one_of(st.lists(event_like, max_size=6), json_values)},
)


def check_typed(doc: ScheduledEventsDocument) -> None:
    assert isinstance(doc.incarnation, int) and 0 <= doc.incarnation < 2**63
    assert len(doc.warnings) <= MAX_WARNINGS + 1
    for parsed in doc.events:
        assert all(isinstance(text, str) and text for text in (parsed.event_id, parsed.event_type, parsed.status))
        assert all(isinstance(name, str) for name in parsed.resources)
        if parsed.not_before is not None:
            assert parsed.not_before.tzinfo is not None
            seconds = parsed.not_before.timestamp()
            assert NOW - NOT_BEFORE_PAST_SECONDS <= seconds <= NOW + NOT_BEFORE_AHEAD_SECONDS


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, document_like))
def test_any_json_gives_a_typed_document_or_the_modules_error(payload: Any) -> None:
    try:
        doc = parse_document(payload, NOW)
    except ScheduledEventsError:
        return
    check_typed(doc)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=200), document_like.map(lambda d: json.dumps(d).encode())))
def test_any_bytes_give_a_typed_document_or_the_modules_error(body: bytes) -> None:
    try:
        doc = parse_body(body, NOW)
    except ScheduledEventsError:
        return
    check_typed(doc)


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b"\xff\xfe\xfa", b'{"DocumentIncarnation": NaN, "Events": []}', b"", b"null"],
    ids=["deep-nesting", "not-utf8", "nan-incarnation", "empty", "null"],
)
def test_bodies_that_are_no_document_raise_the_modules_error(body: bytes) -> None:
    with pytest.raises(ScheduledEventsError):
        parse_body(body, NOW)


@pytest.mark.parametrize("incarnation", [True, 1.5, -1, 2**70, "3", None, float("inf")])
def test_an_incarnation_that_is_not_a_small_integer_rejects_the_document(incarnation: object) -> None:
    with pytest.raises(ScheduledEventsError, match="DocumentIncarnation"):
        parse_document({"DocumentIncarnation": incarnation, "Events": [event()]}, NOW)


@pytest.mark.parametrize("events", [None, "abc", 1, {"EventId": "E1"}])
def test_events_that_are_not_an_array_reject_the_document(events: object) -> None:
    with pytest.raises(ScheduledEventsError, match="Events is"):
        parse_document({"DocumentIncarnation": 2, "Events": events}, NOW)


def test_junk_entries_are_skipped_with_a_warning_and_a_valid_preempt_survives() -> None:
    doc = parse_document(document(2, 1, "abc", event("E1")), NOW)
    assert [e.event_id for e in doc.events] == ["E1"]
    assert doc.warnings == (
        "event 0 skipped: it is a number, not an object",
        "event 1 skipped: it is a string, not an object",
    )
    assert EvictionWatcher(VM).observe(doc) == [EvictionNoticed("E1", "Preempt", "Scheduled", doc.events[0].not_before)]


def test_a_bad_not_before_skips_only_its_own_event() -> None:
    doc = parse_document(document(2, event("BAD", NotBefore="not a date"), event("GOOD")), NOW)
    assert [e.event_id for e in doc.events] == ["GOOD"]
    assert len(doc.warnings) == 1
    assert "'BAD'" in doc.warnings[0] and "NotBefore 'not a date' is not a date" in doc.warnings[0]
    assert doc.skipped_ids == {"BAD"}


@pytest.mark.parametrize(
    "not_before",
    [
        float("nan"),
        float("inf"),
        -float("inf"),
        1e308,
        NOW + 30,
        "Fri, 31 Dec 9999 23:00:00 -0500",
        "Mon, 01 Jan 1900 00:00:00 GMT",
        rfc1123(NOW + NOT_BEFORE_AHEAD_SECONDS + 60),
        rfc1123(NOW - NOT_BEFORE_PAST_SECONDS - 60),
        "Mon, 19 Sep 2016 18:29:47 +9999",
        "x" * 10_000,
        [rfc1123(NOW + 30)],
    ],
)
def test_absurd_not_before_never_comes_out(not_before: object) -> None:
    doc = parse_document(document(2, event("BAD", NotBefore=not_before), event("GOOD")), NOW)
    assert [e.event_id for e in doc.events] == ["GOOD"]
    assert "NotBefore" in doc.warnings[0]


def test_not_before_is_always_utc() -> None:
    text = rfc1123(NOW + 30)
    expected = datetime.fromtimestamp(NOW + 30, UTC)
    for zone, shift in (("GMT", 0), ("-0000", 0), ("+0000", 0), ("+0200", -7200)):
        (parsed,) = parse_document(document(2, event(NotBefore=text.replace("GMT", zone))), NOW).events
        assert parsed.not_before == expected + timedelta(seconds=shift)
        assert parsed.not_before is not None and parsed.not_before.utcoffset() == timedelta(0)
    (started,) = parse_document(document(2, event(EventStatus="Started", NotBefore="")), NOW).events
    assert started.not_before is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("EventId", 7),
        ("EventId", ""),
        ("EventId", None),
        ("EventId", "x" * 1000),
        ("EventType", ["Preempt"]),
        ("EventStatus", {"a": 1}),
        ("Resources", VM),  # a string is not a list of names: "node-1" must not match a VM called "n"
        ("Resources", [VM, 3]),
    ],
)
def test_a_malformed_field_skips_the_event(key: str, value: object) -> None:
    bad = event("BAD")
    bad[key] = value
    doc = parse_document(document(2, bad, event("GOOD")), NOW)
    assert [e.event_id for e in doc.events] == ["GOOD"]
    assert key in doc.warnings[0]


def test_warnings_are_capped() -> None:
    doc = parse_document(document(2, *range(1000)), NOW)
    assert doc.events == ()
    assert len(doc.warnings) == MAX_WARNINGS + 1
    assert doc.warnings[-1] == f"and {1000 - MAX_WARNINGS} more malformed events"


def test_a_status_that_is_no_longer_active_withdraws_the_notice() -> None:
    watcher = EvictionWatcher(VM)
    assert len(watcher.observe(parse_document(document(2, event("E1")), NOW))) == 1
    cancelled = parse_document(document(3, event("E1", EventStatus="Canceled")), NOW)
    assert watcher.observe(cancelled) == [EvictionWithdrawn("E1", "its status is 'Canceled'")]
    assert watcher.observe(parse_document(document(4), NOW)) == [], "withdrawn once"


def test_an_event_that_turns_unreadable_is_not_withdrawn() -> None:
    watcher = EvictionWatcher(VM)
    watcher.observe(parse_document(document(2, event("E1")), NOW))
    garbled = parse_document(document(3, event("E1", NotBefore="soon")), NOW)
    assert watcher.observe(garbled) == []
    assert watcher.observe(parse_document(document(4), NOW)) == [EvictionWithdrawn("E1", "it left the document")]


def test_a_watcher_without_a_name_keeps_the_document_for_later() -> None:
    watcher = EvictionWatcher("")
    doc = parse_document(document(2, event("E1")), NOW)
    assert watcher.observe(doc) == []
    watcher.vm_name = VM
    assert [f.event_id for f in watcher.observe(doc)] == ["E1"]


def test_after_a_withdrawal_the_next_standing_eviction_is_announced_again() -> None:
    watcher = EvictionWatcher(VM)
    both = watcher.observe(parse_document(document(2, event("A"), event("B", "Terminate")), NOW))
    assert [f.event_id for f in both] == ["A", "B"]
    facts = watcher.observe(parse_document(document(3, event("B", "Terminate")), NOW))
    assert [type(f).__name__ for f in facts] == ["EvictionWithdrawn", "EvictionNoticed"]
    assert [f.event_id for f in facts] == ["A", "B"]


BROKEN_FIELDS: list[dict[str, Any]] = [
    {"EventId": 5},
    {"NotBefore": "not a date"},
    {"NotBefore": float("nan")},
    {"NotBefore": "Fri, 31 Dec 9999 23:00:00 GMT"},
    {"Resources": VM},
    {"EventType": None},
    {"EventStatus": ""},
]
broken_event = st.one_of(
    json_scalars,
    st.lists(json_scalars, max_size=3),
    st.builds(lambda event_id, broken: event(str(event_id), **broken), st.uuids(), st.sampled_from(BROKEN_FIELDS)),
)
valid_event = st.builds(
    lambda event_id, event_type, status, mine, offset: event(
        str(event_id),
        event_type,
        EventStatus=status,
        Resources=[VM, "node-9"] if mine else ["node-9"],
        NotBefore=rfc1123(NOW + offset) if status == "Scheduled" else "",
    ),
    st.uuids(),
    st.sampled_from(["Preempt", "Terminate", "Reboot", "Freeze"]),
    st.sampled_from(["Scheduled", "Started"]),
    st.booleans(),
    st.integers(min_value=0, max_value=900),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(valid_event.map(lambda e: (True, e)), broken_event.map(lambda e: (False, e))), max_size=12))
def test_bad_events_are_skipped_and_valid_ones_survive(entries: list[tuple[bool, Any]]) -> None:
    doc = parse_document(document(2, *(raw for _, raw in entries)), NOW)
    assert [e.event_id for e in doc.events] == [raw["EventId"] for good, raw in entries if good]
    assert len(doc.warnings) == sum(not good for good, _ in entries)


pool_event = st.builds(
    lambda event_id, event_type, status, mine: event(
        event_id, event_type, EventStatus=status, Resources=[VM] if mine else ["node-9"], NotBefore=""
    ),
    st.sampled_from(["A", "B", "C", "D"]),
    st.sampled_from(["Preempt", "Terminate", "Reboot"]),
    st.sampled_from(["Scheduled", "Started", "Canceled", "Completed"]),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(pool_event, max_size=4, unique_by=lambda e: e["EventId"]), min_size=1, max_size=8))
def test_facts_track_the_standing_evictions_exactly(documents: list[list[dict[str, Any]]]) -> None:
    """Two consumers: one keeps every notice, one (like the agent) keeps only the first it got."""
    watcher = EvictionWatcher(VM)
    every: dict[str, EvictionNoticed] = {}
    single: str | None = None
    for incarnation, events in enumerate(documents, start=2):
        facts: list[Fact] = watcher.observe(parse_document(document(incarnation, *events), NOW))
        for fact in facts:
            if isinstance(fact, EvictionWithdrawn):
                assert fact.event_id in every, "only what was noticed is withdrawn"
                del every[fact.event_id]
                single = None if single == fact.event_id else single
            else:
                every[fact.event_id] = fact
                single = single or fact.event_id
        standing = {
            e["EventId"]
            for e in events
            if e["EventType"] in EVICTION_TYPES and VM in e["Resources"] and e["EventStatus"] in ACTIVE_STATUSES
        }
        assert set(every) == standing
        assert (single is None) == (not standing) and (single is None or single in standing)
