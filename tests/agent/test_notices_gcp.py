"""GCP's notices: the pure parsers and watcher (with hypothesis), and the hanging GET against the local metadata
server (spotmorph.local.gcp_metadata) and against one that is not GCP's."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotmorph.local.gcp_metadata import GcpMetadataServer, GcpMetadataState
from worker_agent.notices.facts import EvictionNoticed, EvictionWithdrawn
from worker_agent.notices.gcp import (
    HANG_PAUSE,
    NOTICE_SECONDS,
    NOTICE_SOURCE,
    SHUTDOWN_SOURCE,
    GcpMetadataClient,
    GcpNoticeSource,
    GcpWatcher,
    parse_etag,
    parse_preempted,
    shutdown_notice,
)
from worker_agent.notices.parsing import MetadataError

NOW = 1_800_000_000.0
VM = "vm-1"


def test_preempted_is_true_or_false_and_nothing_else() -> None:
    assert parse_preempted(b"TRUE") is True and parse_preempted(b"FALSE\n") is False
    for bad in (b"", b"true", b"YES", b"\xff\xfe", b"TRUE FALSE"):
        with pytest.raises(MetadataError, match="not TRUE or FALSE"):
            parse_preempted(bad)


def test_an_etag_goes_back_into_a_url_only_when_it_looks_like_one() -> None:
    assert parse_etag("5c3a1f0e9d2b7a64") == "5c3a1f0e9d2b7a64"
    assert [parse_etag(v) for v in (None, "", "a&b=c", "x" * 200, "a b")] == [None] * 5


@given(st.binary(max_size=100))
def test_no_body_makes_the_parser_raise_anything_but_a_metadata_error(body: bytes) -> None:
    with contextlib.suppress(MetadataError):
        assert parse_preempted(body) in (True, False)


@given(st.lists(st.booleans(), max_size=20))
def test_the_watcher_reports_a_preemption_once_and_its_end(values: list[bool]) -> None:
    watcher = GcpWatcher()
    standing = False
    for value in values:
        for fact in watcher.observe(value, NOW):
            assert isinstance(fact, EvictionNoticed) != standing
            standing = isinstance(fact, EvictionNoticed)
    assert standing == (bool(values) and values[-1])


def test_a_notice_is_30_seconds_from_when_it_was_seen() -> None:
    (notice,) = GcpWatcher().observe(True, NOW)
    assert isinstance(notice, EvictionNoticed) and notice.source == NOTICE_SOURCE
    assert notice.not_before == datetime.fromtimestamp(NOW + NOTICE_SECONDS, UTC)
    shutdown = shutdown_notice(NOW)
    assert shutdown.source == SHUTDOWN_SOURCE and shutdown.not_before == notice.not_before
    assert GcpWatcher(notice).observe(False, NOW) == [EvictionWithdrawn("gcp-preempted", "preempted is FALSE again")]


@pytest.fixture
def server() -> Iterator[GcpMetadataServer]:
    srv = GcpMetadataServer(state=GcpMetadataState(lambda: NOW)).start()
    yield srv
    srv.stop()


def test_a_hanging_get_returns_when_the_vm_is_preempted(server: GcpMetadataServer) -> None:
    client = GcpMetadataClient(f"{server.base_url}/{VM}", hang_seconds=30)
    plain = client.read(None)
    assert plain.preempted is False and plain.etag is not None and not plain.hung
    seen: list[Any] = []
    reader = threading.Thread(target=lambda: seen.append(client.read(plain.etag)))
    started = time.monotonic()
    reader.start()
    server.state.preempt(VM, 30)  # before or while it hangs: either way it returns at once, preempted
    reader.join(20)
    assert time.monotonic() - started < 10, "woken by the change, not by timeout_sec"
    (hung,) = seen
    assert hung.preempted is True and hung.hung and hung.etag != plain.etag
    assert client.read(plain.etag).preempted is True, "a stale ETag returns at once"


def test_a_hanging_get_ends_at_timeout_sec_when_nothing_changes(server: GcpMetadataServer) -> None:
    client = GcpMetadataClient(f"{server.base_url}/{VM}", hang_seconds=1)
    etag = client.read(None).etag
    again = client.read(etag)
    assert again.preempted is False and again.etag == etag


def test_the_source_hangs_after_its_first_look_and_reports_the_preemption(server: GcpMetadataServer) -> None:
    source = GcpNoticeSource(GcpMetadataClient(f"{server.base_url}/{VM}"), poll_seconds=1.0, wall_clock=lambda: NOW)
    first = source.poll()
    assert first.facts == () and first.wait == 1.0 and source.etag is not None
    server.state.preempt(VM, 30)
    preempted = source.poll()
    assert [type(f) for f in preempted.facts] == [EvictionNoticed] and preempted.wait == HANG_PAUSE
    server.state.restore(VM)
    assert [type(f) for f in source.poll().facts] == [EvictionWithdrawn]


class _Impostor(BaseHTTPRequestHandler):
    """Answers TRUE, but without the Metadata-Flavor header GCP's metadata server always sends."""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"TRUE")


def test_an_answer_without_metadata_flavor_is_no_notice(caplog: pytest.LogCaptureFixture) -> None:
    impostor = ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{impostor.server_address[1]}"
        polled = GcpNoticeSource(GcpMetadataClient(url)).poll()
    finally:
        impostor.shutdown()
        impostor.server_close()
    assert polled.facts == () and "not GCP's metadata server" in caplog.text


def test_a_source_whose_server_is_gone_reports_nothing_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    source = GcpNoticeSource(GcpMetadataClient("http://127.0.0.1:9", timeout_seconds=0.5), poll_seconds=2.0)
    source.etag = "abc"
    polled = source.poll()
    assert polled.facts == () and polled.wait == 2.0 and source.etag is None, "the next look is a plain one"
    assert "gcp metadata: GET /computeMetadata/v1/instance/preempted: connection failed" in caplog.text
