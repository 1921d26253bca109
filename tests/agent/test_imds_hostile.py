"""A hostile metadata service on 127.0.0.1: slow, huge, broken answers never stop the agent's eviction watch."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from worker_agent.agent.daemon import Agent, AgentConfig
from worker_agent.agent.decisions import EvictionNotice
from worker_agent.scheduled_events import (
    EvictionNoticed,
    EvictionPoller,
    EvictionWatcher,
    ScheduledEventsClient,
    ScheduledEventsDocument,
    ScheduledEventsError,
)

VM = "node-1"


def preempt(event_id: str = "E1", notice_seconds: float = 30) -> dict[str, Any]:
    not_before = datetime.now(UTC) + timedelta(seconds=notice_seconds)
    return {
        "EventId": event_id,
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "EventStatus": "Scheduled",
        "NotBefore": format_datetime(not_before, usegmt=True),
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def body(incarnation: int, events: object, **extra: object) -> bytes:
    return json.dumps({"DocumentIncarnation": incarnation, "Events": events, **extra}).encode()


@dataclass(frozen=True)
class Answer:
    body: bytes
    status: int = 200
    content_length: bool = True
    drip_seconds: float = 0.0  # pause after each byte; 0 sends everything at once
    drip_headers: bool = False  # drip the status line and headers too, not only the body
    stall: bool = False  # send the headers, then nothing


class HostileIMDS:
    """Answers each request with the first queued answer (the last one stays) and counts what it sent."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.served = 0
        self.sent = 0
        self.posts = 0  # acknowledgements received
        self.stall_posts = False  # never answer an acknowledgement (until stopped)
        self.closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.imds = self  # type: ignore[attr-defined]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def next_answer(self) -> Answer:
        self.served += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def stop(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        imds: HostileIMDS = self.server.imds  # type: ignore[attr-defined]
        imds.posts += 1
        if imds.stall_posts:
            imds.closing.wait(30)
            return
        self.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")

    def do_GET(self) -> None:
        imds: HostileIMDS = self.server.imds  # type: ignore[attr-defined]
        answer = imds.next_answer()
        head = f"HTTP/1.0 {answer.status} Whatever\r\nContent-Type: application/json\r\n"
        if answer.content_length:
            head += f"Content-Length: {len(answer.body)}\r\n"
        head_bytes = (head + "\r\n").encode()
        try:
            if not answer.drip_headers:
                self.wfile.write(head_bytes)
                imds.sent += len(head_bytes)
                head_bytes = b""
            if answer.stall:
                imds.closing.wait(30)
                return
            rest = head_bytes + answer.body
            if not answer.drip_seconds:
                self.wfile.write(rest)
                imds.sent += len(rest)
                return
            for index in range(len(rest)):
                if imds.closing.is_set():
                    return
                self.wfile.write(rest[index : index + 1])
                imds.sent += 1
                time.sleep(answer.drip_seconds)
        except OSError:  # the client hung up, as it should
            return


@pytest.fixture
def imds() -> Iterator[HostileIMDS]:
    server = HostileIMDS(Answer(body(1, [])))
    yield server
    server.stop()


class Ticker:
    """An injected monotonic clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.parametrize("drip_headers", [False, True], ids=["body", "whole-answer"])
def test_a_dripping_answer_is_cut_off_at_the_request_deadline(imds: HostileIMDS, drip_headers: bool) -> None:
    late = body(2, [preempt()], Description="x" * 400)
    imds.answers = [Answer(late, drip_seconds=0.002, drip_headers=drip_headers)]
    ticker = Ticker(step=0.1)
    client = ScheduledEventsClient(imds.base_url, timeout_seconds=2.0, clock=ticker)
    started = ticker.now
    with pytest.raises(ScheduledEventsError, match="no complete answer within 2 s"):
        client.fetch()
    assert ticker.now - started <= 2.0 + 2 * ticker.step, "the call ends at the deadline, not when the body does"
    assert imds.sent < len(late) / 2, "the rest of the late document is never read"


def test_a_dripping_answer_is_cut_off_with_the_real_clock(imds: HostileIMDS) -> None:
    imds.answers = [Answer(body(2, [preempt()], Description="x" * 400), drip_seconds=0.05)]
    with pytest.raises(ScheduledEventsError, match="no complete answer"):
        ScheduledEventsClient(imds.base_url, timeout_seconds=0.3).fetch()


def test_a_service_that_stalls_after_the_headers_is_an_error(imds: HostileIMDS) -> None:
    imds.answers = [Answer(body(2, [preempt()]), stall=True)]
    with pytest.raises(ScheduledEventsError, match="no complete answer"):
        ScheduledEventsClient(imds.base_url, timeout_seconds=0.3).fetch()


@pytest.mark.parametrize("content_length", [True, False], ids=["announced", "unannounced"])
def test_a_huge_body_is_refused(imds: HostileIMDS, content_length: bool) -> None:
    huge = body(2, [preempt()], Padding="x" * 300_000)
    imds.answers = [Answer(huge, content_length=content_length)]
    with pytest.raises(ScheduledEventsError, match="65536-byte cap"):
        ScheduledEventsClient(imds.base_url, max_body_bytes=65_536).fetch()


def test_a_body_at_the_cap_is_read(imds: HostileIMDS) -> None:
    exact = body(2, [preempt()])
    imds.answers = [Answer(exact, content_length=False)]
    assert ScheduledEventsClient(imds.base_url, max_body_bytes=len(exact)).fetch().incarnation == 2


@pytest.mark.parametrize(
    "answer",
    [Answer(b"{}", status=500), Answer(b"<html>busy</html>"), Answer(b"\xff\xfe\x00garbage"), Answer(b"[" * 50_000)],
    ids=["http-500", "html", "binary", "deep-nesting"],
)
def test_broken_answers_are_the_modules_error(imds: HostileIMDS, answer: Answer) -> None:
    imds.answers = [answer]
    with pytest.raises(ScheduledEventsError):
        ScheduledEventsClient(imds.base_url).fetch()


def test_junk_events_beside_a_valid_preempt_still_give_the_notice(imds: HostileIMDS) -> None:
    imds.answers = [Answer(body(2, [1, "abc", preempt("E1")]))]
    document = ScheduledEventsClient(imds.base_url).fetch()
    assert len(document.warnings) == 2
    facts = EvictionWatcher(VM).observe(document)
    assert [(type(f), f.event_id) for f in facts] == [(EvictionNoticed, "E1")]


def test_a_poller_fed_bad_documents_then_a_valid_one_reports_the_valid_one(
    imds: HostileIMDS, caplog: pytest.LogCaptureFixture
) -> None:
    imds.answers = [
        Answer(body(2, [1])),
        Answer(body(3, "abc")),
        Answer(b"not json"),
        Answer(body(4, [preempt("E1")])),
    ]
    poller = EvictionPoller(ScheduledEventsClient(imds.base_url), EvictionWatcher(VM))
    with caplog.at_level(logging.DEBUG, logger="spotmorph.agent.imds"):
        assert [poller.poll() for _ in range(3)] == [[], [], []]
        facts = poller.poll()
    assert [(type(f), f.event_id) for f in facts] == [(EvictionNoticed, "E1")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("event 0 skipped: it is a number" in w for w in warnings)
    assert any("Events is a string" in w for w in warnings)
    assert any("not JSON" in w for w in warnings)


def test_a_repeated_problem_is_warned_about_once(imds: HostileIMDS, caplog: pytest.LogCaptureFixture) -> None:
    imds.answers = [Answer(body(2, [1]))]
    poller = EvictionPoller(ScheduledEventsClient(imds.base_url), EvictionWatcher(VM))
    with caplog.at_level(logging.DEBUG, logger="spotmorph.agent.imds"):
        for _ in range(3):
            poller.poll()
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_a_poller_survives_an_unexpected_error(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(ScheduledEventsClient):
        def fetch(self) -> ScheduledEventsDocument:
            raise KeyError("a bug")

    poller = EvictionPoller(Broken("http://127.0.0.1:9"), EvictionWatcher(VM))
    assert poller.poll() == []
    assert "unexpected KeyError" in caplog.text


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_the_agent_outlives_a_bad_document_and_clears_a_withdrawn_notice(
    imds: HostileIMDS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    imds.answers = [Answer(body(2, [1, "abc"]))]
    config = AgentConfig(("127.0.0.1:9",), "token", tmp_path, imds_url=imds.base_url, vm_name=VM, poll_seconds=0.01)
    agent = Agent(config)
    reported: list[Any] = []

    async def report(request: Any) -> None:
        reported.append(request)

    monkeypatch.setattr(agent, "_report", report)

    async def scenario() -> None:
        watching = asyncio.create_task(agent.evictions.watch())
        await _until(lambda: imds.served >= 3)
        assert not watching.done(), "a bad document must not end the watch"
        imds.answers = [Answer(body(3, [1, "abc", preempt("E1")]))]
        await _until(lambda: agent.state.notice is not None)
        imds.answers = [Answer(body(4, []))]
        await _until(lambda: agent.state.notice is None)
        watching.cancel()

    asyncio.run(asyncio.wait_for(scenario(), timeout=20))
    assert [type(r).__name__ for r in reported] == ["EvictionNotice"]


@pytest.mark.parametrize("answers", [True, False])
def test_an_acknowledgement_never_holds_the_agents_loop(imds: HostileIMDS, tmp_path: Path, answers: bool) -> None:
    """Before: the POST ran on the event loop, which a service that never answered held 2 s of every 3."""
    imds.stall_posts = not answers
    agent = Agent(AgentConfig(("127.0.0.1:9",), "token", tmp_path, imds_url=imds.base_url, vm_name=VM))
    agent.state.notice = EvictionNotice("E1", time.time() + 30)

    async def scenario() -> None:
        agent.evictions.acknowledge_if_done([])  # no trainer left: the platform may evict now
        in_flight = agent.evictions.acknowledging
        assert in_flight is not None and not in_flight.done(), "the loop goes on while the POST is out"
        agent.evictions.acknowledge_if_done([])  # the next beat sends no second one while it is
        await _until(lambda: imds.posts >= 1)
        if answers:
            await in_flight
            assert agent.state.notice is not None and agent.state.notice.acknowledged
        else:
            assert not in_flight.done() and agent.state.notice is not None and not agent.state.notice.acknowledged
            in_flight.cancel()

    asyncio.run(asyncio.wait_for(scenario(), timeout=20))
    assert imds.posts == 1
