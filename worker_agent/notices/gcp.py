"""Eviction notices from GCP's metadata server (``http://metadata.google.internal``).

A Spot (or preemptible) VM learns of its preemption two ways at once, about 30 s before it stops:

- ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` answers ``TRUE`` or ``FALSE``;
  with ``wait_for_change=true&last_etag=E`` the request hangs until the value's ETag differs from ``E`` (or
  ``timeout_sec`` passes), so a change is seen as it happens. The answer carries ``Metadata-Flavor: Google`` too;
  one without it is not GCP's metadata server.
- the guest is shut down (ACPI), so the agent gets a SIGTERM from its service manager: with ``--cloud gcp`` the
  agent takes it as a notice first (:func:`shutdown_notice`), and exits once its trainers have left.

GCP gives no time in the notice: ``not_before`` is when the agent saw it plus :data:`NOTICE_SECONDS`. GCP
documents no early warning for Spot VMs (nothing like AWS's rebalance recommendation), so this source reports
none. The answers are read as hostile: a bounded body, a deadline per request, a pure parser, and a poll that never
raises.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from worker_agent.deadline_http import RequestFailed, exchange
from worker_agent.notices.facts import AnyFact, EvictionNoticed, EvictionWithdrawn, Polled, Problems
from worker_agent.notices.parsing import MetadataError

log = logging.getLogger("spotmorph.agent.imds")

DEFAULT_BASE_URL = "http://metadata.google.internal"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
FLAVOR_HEADER = "Metadata-Flavor"
FLAVOR = "Google"
NOTICE_SECONDS = 30.0  # a Spot VM's shutdown period
HANG_SECONDS = 20  # timeout_sec of a hanging GET: the server answers by then even when nothing changed
HANG_PAUSE = 0.1  # after a hanging GET returned: a server that ignores last_etag cannot make the agent spin
MAX_BODY_BYTES = 64
ETAG = re.compile(r"[0-9A-Za-z_.-]{1,128}")
NOTICE_ID = "gcp-preempted"
NOTICE_SOURCE = "gcp-metadata-preempted"
SHUTDOWN_ID = "gcp-shutdown"
SHUTDOWN_SOURCE = "gcp-guest-shutdown"


def parse_preempted(body: bytes) -> bool:
    """``TRUE`` or ``FALSE`` (surrounding whitespace aside); anything else is a :class:`MetadataError`."""
    text = body.decode("ascii", errors="replace").strip()
    if text == "TRUE":
        return True
    if text == "FALSE":
        return False
    raise MetadataError(f"preempted is {text[:32]!r}, not TRUE or FALSE")


def parse_etag(value: str | None) -> str | None:
    """An ETag fit to send back in a URL; a missing or odd one is ``None`` (the next look is a plain GET)."""
    return value if value is not None and ETAG.fullmatch(value) else None


def notice_at(now: float) -> datetime:
    return datetime.fromtimestamp(now + NOTICE_SECONDS, UTC)


def shutdown_notice(now: float) -> EvictionNoticed:
    """The notice a SIGTERM from the guest's shutdown stands for (``now``: epoch seconds)."""
    return EvictionNoticed(SHUTDOWN_ID, "Shutdown", "Started", notice_at(now), SHUTDOWN_SOURCE)


@dataclass
class GcpWatcher:
    """``preempted`` values into facts, each reported once."""

    notice: EvictionNoticed | None = None

    def observe(self, preempted: bool, now: float) -> list[AnyFact]:
        if preempted and self.notice is None:
            self.notice = EvictionNoticed(NOTICE_ID, "Preempt", "Started", notice_at(now), NOTICE_SOURCE)
            return [self.notice]
        if not preempted and self.notice is not None:
            self.notice = None
            return [EvictionWithdrawn(NOTICE_ID, "preempted is FALSE again")]
        return []


@dataclass(frozen=True)
class Reading:
    preempted: bool
    etag: str | None
    hung: bool  # it was a hanging GET (so the next one may follow at once)


class GcpMetadataClient:
    """Blocking GETs of ``preempted``: a plain one while no ETag is known, else a hanging one."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        timeout_seconds: float = 2.0,
        hang_seconds: int = HANG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout_seconds
        self.hang = hang_seconds
        self.clock = clock

    def read(self, etag: str | None) -> Reading:
        """The value now (``etag`` None), or once it differs from ``etag`` (or the server's timeout passed)."""
        url, timeout = self.base_url + PREEMPTED_PATH, self.timeout
        if etag is not None:
            url += f"?wait_for_change=true&last_etag={quote(etag, safe='')}&timeout_sec={self.hang}"
            timeout += self.hang
        try:
            answer = exchange(
                url, headers={FLAVOR_HEADER: FLAVOR}, timeout=timeout, max_body_bytes=MAX_BODY_BYTES, clock=self.clock
            )
        except RequestFailed as exc:
            raise MetadataError(f"GET {PREEMPTED_PATH}: {exc}") from exc
        if answer.status != 200:
            raise MetadataError(f"GET {PREEMPTED_PATH}: HTTP {answer.status}")
        if answer.header(FLAVOR_HEADER) != FLAVOR:
            raise MetadataError(f"the answer has no {FLAVOR_HEADER}: {FLAVOR} header: not GCP's metadata server")
        return Reading(parse_preempted(answer.body), parse_etag(answer.header("ETag")), etag is not None)


class GcpNoticeSource:
    """One (possibly hanging) look, facts out; it never raises (:class:`~.facts.NoticeSource`)."""

    def __init__(
        self, client: GcpMetadataClient, poll_seconds: float = 1.0, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.client = client
        self.poll_seconds = poll_seconds
        self.wall_clock = wall_clock
        self.watcher = GcpWatcher()
        self.etag: str | None = None
        self.problems = Problems(log, "gcp metadata")

    def poll(self) -> Polled:
        try:
            reading = self.client.read(self.etag)
        except MetadataError as exc:
            self.problems.say((str(exc),))
            self.etag = None  # the next look is a plain GET: a hanging one might wait on a value never seen
            return Polled((), self.poll_seconds)
        except Exception as exc:  # a bug here must not end eviction watching for good
            self.problems.unexpected(exc)
            self.etag = None
            return Polled((), self.poll_seconds)
        self.problems.say(())
        self.etag = reading.etag
        facts = self.watcher.observe(reading.preempted, self.wall_clock())
        wait = HANG_PAUSE if reading.hung and reading.etag is not None else self.poll_seconds
        return Polled(tuple(facts), wait)
