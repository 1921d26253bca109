"""Hostile AWS and GCP metadata services on 127.0.0.1: huge, stalled and garbled answers cost a poll, never the
watch, and the next good answer is read."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from worker_agent.notices.aws import AwsMetadataClient, AwsNoticeSource
from worker_agent.notices.facts import EvictionNoticed
from worker_agent.notices.gcp import GcpMetadataClient, GcpNoticeSource


@dataclass(frozen=True)
class Answer:
    body: bytes
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    stall: bool = False  # the headers and the body, then nothing of the 10 bytes more promised


@dataclass
class Hostile:
    """Answers each request with the next scripted answer (the last one again once they run out); a PUT (AWS's
    token) always gets a good token."""

    answers: list[Answer]
    closing: threading.Event

    def next(self) -> Answer:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_PUT(self) -> None:
        self._answer(Answer(b"good-token"))

    def do_GET(self) -> None:
        self._answer(self.server.hostile.next())

    def _answer(self, answer: Answer) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Length", str(len(answer.body) + (10 if answer.stall else 0)))
        for name, value in answer.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(answer.body)
        if answer.stall:  # more promised than sent
            self.wfile.flush()
            self.server.hostile.closing.wait(30)


@pytest.fixture
def hostile() -> Iterator[tuple[Hostile, str]]:
    service = Hostile([Answer(b"")], threading.Event())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.hostile = service  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield service, f"http://127.0.0.1:{server.server_address[1]}"
    service.closing.set()
    server.shutdown()
    server.server_close()


NOTICE = json.dumps(
    {"action": "terminate", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))}
)


def test_aws_huge_stalled_and_garbled_answers_cost_a_poll_each(
    hostile: tuple[Hostile, str], caplog: pytest.LogCaptureFixture
) -> None:
    service, url = hostile
    none = Answer(b"", status=404)
    service.answers = [
        Answer(b"x" * 200_000),  # the instance-action, over the cap
        none,
        Answer(b"{", stall=True),  # the headers, then nothing
        none,
        Answer(b"\xff\xfe{garbage"),
        Answer(b"[" * 50_000),
        Answer(NOTICE.encode()),
        none,
    ]
    source = AwsNoticeSource(AwsMetadataClient(url, timeout_seconds=0.3))
    started = time.monotonic()
    assert [source.poll().facts for _ in range(3)] == [(), (), ()]
    assert time.monotonic() - started < 5, "a stalled answer ends at its request's deadline"
    (notice,) = source.poll().facts
    assert isinstance(notice, EvictionNoticed) and notice.event_type == "terminate"
    assert "byte cap" in caplog.text and "no complete answer within 0.3 s" in caplog.text and "not JSON" in caplog.text


def test_gcp_huge_stalled_and_impostor_answers_cost_a_poll_each(
    hostile: tuple[Hostile, str], caplog: pytest.LogCaptureFixture
) -> None:
    service, url = hostile
    flavor = (("Metadata-Flavor", "Google"), ("ETag", "0001"))
    service.answers = [
        Answer(b"TRUE" * 100, headers=flavor),
        Answer(b"", headers=flavor, stall=True),
        Answer(b"TRUE"),  # no Metadata-Flavor: not GCP's
        Answer(b"MAYBE", headers=flavor),
        Answer(b"TRUE", headers=flavor),
    ]
    source = GcpNoticeSource(GcpMetadataClient(url, timeout_seconds=0.3), poll_seconds=0.01)
    assert [source.poll().facts for _ in range(4)] == [(), (), (), ()]
    (notice,) = source.poll().facts
    assert isinstance(notice, EvictionNoticed) and notice.event_id == "gcp-preempted"
    for said in ("byte cap", "no complete answer", "not GCP's metadata server", "not TRUE or FALSE"):
        assert said in caplog.text
