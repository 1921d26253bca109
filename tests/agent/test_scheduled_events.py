"""The IMDS Scheduled Events path: the watcher (pure) and the client against a real local server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from spotmorph.local.imds_server import ScheduledEventsServer, ScheduledEventsState
from worker_agent.scheduled_events import (
    EvictionNoticed,
    EvictionWatcher,
    EvictionWithdrawn,
    ScheduledEventsClient,
    ScheduledEventsError,
    parse_document,
    seconds_until,
)


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[ScheduledEventsServer]:
    srv = ScheduledEventsServer(state=ScheduledEventsState(clock)).start()
    yield srv
    srv.stop()


def test_preempt_appears_starts_and_vanishes(server: ScheduledEventsServer, clock: FakeClock) -> None:
    client = ScheduledEventsClient(server.base_url, wall_clock=clock)
    watcher = EvictionWatcher("node-2")
    assert watcher.observe(client.fetch()) == []

    event_id = server.state.schedule("Preempt", ["node-2"], notice_seconds=30)
    facts = watcher.observe(client.fetch())
    assert len(facts) == 1
    notice = facts[0]
    assert isinstance(notice, EvictionNoticed)
    assert (notice.event_id, notice.event_type, notice.status) == (event_id, "Preempt", "Scheduled")
    assert seconds_until(notice.not_before, clock.now) == pytest.approx(30, abs=1)
    assert watcher.observe(client.fetch()) == [], "the same incarnation is reported once"

    client.acknowledge(event_id)
    started = watcher.observe(client.fetch())
    assert [(f.event_id, getattr(f, "status", None)) for f in started] == [(event_id, "Started")]
    assert server.state.admin_view()[0]["Acknowledged"] is True

    server.state.remove(event_id)
    assert watcher.observe(client.fetch()) == [EvictionWithdrawn(event_id, "it left the document")]


def test_event_starts_by_itself_after_not_before(server: ScheduledEventsServer, clock: FakeClock) -> None:
    client = ScheduledEventsClient(server.base_url, wall_clock=clock)
    watcher = EvictionWatcher("node-1")
    server.state.schedule("Terminate", ["node-1"], notice_seconds=10)
    assert [getattr(f, "status", None) for f in watcher.observe(client.fetch())] == ["Scheduled"]
    clock.now += 11
    assert [getattr(f, "status", None) for f in watcher.observe(client.fetch())] == ["Started"]


def test_other_vms_and_other_event_types_are_ignored(server: ScheduledEventsServer, clock: FakeClock) -> None:
    client = ScheduledEventsClient(server.base_url, wall_clock=clock)
    watcher = EvictionWatcher("node-1")
    server.state.schedule("Preempt", ["node-7"], notice_seconds=30)
    server.state.schedule("Freeze", ["node-1"], notice_seconds=15)
    server.state.schedule("Reboot", ["node-1"], notice_seconds=15)
    assert watcher.observe(client.fetch()) == []
    doc = client.fetch()
    assert len(doc.events) == 3


def test_a_notice_that_never_comes_reports_nothing(server: ScheduledEventsServer, clock: FakeClock) -> None:
    client = ScheduledEventsClient(server.base_url, wall_clock=clock)
    watcher = EvictionWatcher("node-1")
    for _ in range(5):
        clock.now += 60
        assert watcher.observe(client.fetch()) == []


def test_imds_rules_on_headers_and_versions(server: ScheduledEventsServer) -> None:
    url = f"{server.base_url}/metadata/scheduledevents?api-version=2020-07-01"
    with pytest.raises(urllib.error.HTTPError) as no_header:
        urllib.request.urlopen(url, timeout=5)
    assert no_header.value.code == 400
    assert "metadata header" in json.loads(no_header.value.read())["error"]
    bare = urllib.request.Request(f"{server.base_url}/metadata/scheduledevents", headers={"Metadata": "true"})
    with pytest.raises(urllib.error.HTTPError) as no_version:
        urllib.request.urlopen(bare, timeout=5)
    assert no_version.value.code == 400


def test_admin_api_over_http(server: ScheduledEventsServer, clock: FakeClock) -> None:
    body = json.dumps({"EventType": "Preempt", "Resources": ["node-3"], "NoticeSeconds": 5}).encode()
    request = urllib.request.Request(f"{server.base_url}/admin/events", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        event_id = json.loads(response.read())["EventId"]
    doc = ScheduledEventsClient(server.base_url, wall_clock=clock).fetch()
    assert [e.event_id for e in doc.events] == [event_id]
    bad = urllib.request.Request(
        f"{server.base_url}/admin/events", data=json.dumps({"EventType": "Explode"}).encode(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as rejected:
        urllib.request.urlopen(bad, timeout=5)
    assert rejected.value.code == 400


def test_unreachable_service_is_a_clear_error() -> None:
    client = ScheduledEventsClient("http://127.0.0.1:9", timeout_seconds=1)
    with pytest.raises(ScheduledEventsError, match="connection failed"):
        client.fetch()


@pytest.mark.parametrize(
    "payload",
    [[], {"Events": []}, {"DocumentIncarnation": "x", "Events": []}, {"DocumentIncarnation": 1, "Events": {}}],
)
def test_malformed_documents_are_rejected(payload: object) -> None:
    with pytest.raises(ScheduledEventsError):
        parse_document(payload, now=1_800_000_000.0)


def test_documented_example_parses() -> None:
    september_2016 = 1_474_300_000.0
    doc = parse_document(
        {
            "DocumentIncarnation": 3,
            "Events": [
                {
                    "EventId": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": ["myvmss_0"],
                    "EventStatus": "Scheduled",
                    "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            ],
        },
        now=september_2016,
    )
    assert doc.incarnation == 3
    assert doc.events[0].not_before is not None
    assert doc.events[0].not_before.year == 2016
