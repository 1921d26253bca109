"""Eviction notices from AWS's instance metadata service (IMDSv2, ``http://169.254.169.254``).

Every call carries a session token: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` gives
one, every ``GET`` sends it as ``X-aws-ec2-metadata-token``, and it is renewed before its TTL ends (and at once on a
401). Two documents matter:

- ``/latest/meta-data/spot/instance-action``: 404 until AWS schedules an interruption, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2026-11-29T01:02:03Z"}`` about two minutes ahead: an
  :class:`~.facts.EvictionNoticed` with ``not_before`` = ``time``;
- ``/latest/meta-data/events/recommendations/rebalance``: 404, or ``{"noticeTime": "..."}`` once the instance is at
  elevated risk of interruption: an :class:`~.facts.EvictionRiskNoticed` (AWS may send it with the notice, or not
  at all).

The service may answer anything, slowly or not at all: the parsers are pure, each document is read on its own (an
unreadable one withdraws nothing), every request has one deadline and a capped body, and a poll never raises.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from worker_agent.deadline_http import Answer, RequestFailed, exchange
from worker_agent.notices.facts import (
    AnyFact,
    EvictionNoticed,
    EvictionRiskNoticed,
    EvictionRiskWithdrawn,
    EvictionWithdrawn,
    Polled,
    Problems,
)
from worker_agent.notices.parsing import MetadataError, Unreadable, iso_time, json_object, kind

log = logging.getLogger("spotmorph.agent.imds")

DEFAULT_BASE_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
ACTIONS = frozenset({"terminate", "stop", "hibernate"})
NOTICE_SOURCE = "aws-spot-instance-action"
RISK_SOURCE = "aws-rebalance-recommendation"
TOKEN_TTL_SECONDS = 300  # AWS allows 1 to 21600; a short one limits what a leaked token is worth
RENEW_AFTER = 0.8  # of the TTL: a token is renewed well before AWS stops taking it
MAX_POLL_SECONDS = 2.0  # the notice is about two minutes long: look at least this often
MAX_BODY_BYTES = 64 * 1024
MAX_TOKEN = 1024
TOKEN = re.compile(r"[A-Za-z0-9+/=_.~-]+")  # base64 and its URL-safe kin: never a CR or LF into a header

T = TypeVar("T")


@dataclass(frozen=True)
class InstanceAction:
    action: str
    time: datetime  # aware, UTC


@dataclass(frozen=True)
class Rebalance:
    notice_time: datetime  # aware, UTC


def parse_token(body: bytes) -> str:
    """A session token as the ``PUT`` gave it; never printed (it is a credential)."""
    text = body.decode("ascii", errors="replace").strip()
    if not text or len(text) > MAX_TOKEN or not TOKEN.fullmatch(text):
        raise MetadataError(f"the session token ({len(body)} bytes) is not a token")
    return text


def parse_instance_action(body: bytes, now: float) -> InstanceAction:
    payload = json_object(body, "instance-action")
    action = payload.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        shown = repr(action[:32]) if isinstance(action, str) else kind(action)
        raise MetadataError(f"instance-action's action is {shown}, not one of {', '.join(sorted(ACTIONS))}")
    return InstanceAction(action, iso_time(payload.get("time"), "instance-action's time", now))


def parse_rebalance(body: bytes, now: float) -> Rebalance:
    payload = json_object(body, "the rebalance recommendation")
    return Rebalance(iso_time(payload.get("noticeTime"), "the rebalance recommendation's noticeTime", now))


@dataclass
class AwsWatcher:
    """Turns successive looks into facts, each reported once; ``None``: the document is absent (a 404)."""

    notice: EvictionNoticed | None = None
    risk: EvictionRiskNoticed | None = None

    def observe(
        self, action: InstanceAction | Unreadable | None, rebalance: Rebalance | Unreadable | None, now: float
    ) -> list[AnyFact]:
        facts: list[AnyFact] = []
        if isinstance(action, InstanceAction):
            stamp = action.time.strftime("%Y%m%dT%H%M%SZ")
            notice = EvictionNoticed(
                f"aws-{action.action}-{stamp}", action.action, "Scheduled", action.time, NOTICE_SOURCE
            )
            if notice != self.notice:
                if self.notice is not None:
                    facts.append(EvictionWithdrawn(self.notice.event_id, f"AWS now says {action.action} at {stamp}"))
                facts.append(notice)
                self.notice = notice
        elif action is None and self.notice is not None:
            facts.append(EvictionWithdrawn(self.notice.event_id, "the instance-action is gone"))
            self.notice = None
        if isinstance(rebalance, Rebalance) and self.risk is None:
            self.risk = EvictionRiskNoticed(RISK_SOURCE, now, f"noticeTime {rebalance.notice_time.isoformat()}")
            facts.append(self.risk)
        elif rebalance is None and self.risk is not None:
            facts.append(EvictionRiskWithdrawn(RISK_SOURCE, "the rebalance recommendation is gone"))
            self.risk = None
        return facts


class AwsMetadataClient:
    """Blocking calls to IMDSv2 under one deadline each, with the session token kept and renewed."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        timeout_seconds: float = 1.0,
        ttl_seconds: int = TOKEN_TTL_SECONDS,
        max_body_bytes: int = MAX_BODY_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout_seconds
        self.ttl = ttl_seconds
        self.max_body_bytes = max_body_bytes
        self.clock = clock
        self._token: str | None = None
        self._renew_at = 0.0

    def _call(self, method: str, path: str, headers: Mapping[str, str]) -> Answer:
        try:
            return exchange(
                self.base_url + path,
                method=method,
                headers=headers,
                timeout=self.timeout,
                max_body_bytes=self.max_body_bytes,
                clock=self.clock,
            )
        except RequestFailed as exc:
            raise MetadataError(f"{method} {path}: {exc}") from exc

    def token(self) -> str:
        """The session token, renewed once ``RENEW_AFTER`` of its TTL has passed."""
        now = self.clock()
        if self._token is None or now >= self._renew_at:
            self._token = None
            answer = self._call("PUT", TOKEN_PATH, {TTL_HEADER: str(self.ttl)})
            if answer.status != 200:
                raise MetadataError(f"PUT {TOKEN_PATH}: HTTP {answer.status} (IMDSv2 refused a session token)")
            self._token = parse_token(answer.body)
            self._renew_at = now + self.ttl * RENEW_AFTER
        return self._token

    def get(self, path: str) -> bytes | None:
        """The document at ``path``; ``None`` when there is none (404). A 401 (the token expired or was revoked)
        gets a new token and one more try."""
        for attempt in range(2):
            answer = self._call("GET", path, {TOKEN_HEADER: self.token()})
            if answer.status == 401 and attempt == 0:
                self._token = None
                continue
            if answer.status == 404:
                return None
            if answer.status == 200:
                return answer.body
            raise MetadataError(f"GET {path}: HTTP {answer.status}")
        raise MetadataError(f"GET {path}: HTTP 401 with a new token too")


class AwsNoticeSource:
    """One look at both documents, facts out; it never raises (:class:`~.facts.NoticeSource`)."""

    def __init__(
        self, client: AwsMetadataClient, poll_seconds: float = 1.0, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.client = client
        self.wait = min(poll_seconds, MAX_POLL_SECONDS)
        self.wall_clock = wall_clock
        self.watcher = AwsWatcher()
        self.problems = Problems(log, "aws metadata")

    def poll(self) -> Polled:
        try:
            now = self.wall_clock()
            problems: list[str] = []
            action = self._look(INSTANCE_ACTION_PATH, parse_instance_action, now, problems)
            rebalance = self._look(REBALANCE_PATH, parse_rebalance, now, problems)
            self.problems.say(tuple(problems))
            return Polled(tuple(self.watcher.observe(action, rebalance, now)), self.wait)
        except Exception as exc:  # a bug here must not end eviction watching for good
            self.problems.unexpected(exc)
            return Polled((), self.wait)

    def _look(
        self, path: str, parse: Callable[[bytes, float], T], now: float, problems: list[str]
    ) -> T | Unreadable | None:
        """One document: its value, ``None`` when absent, or why it could not be read (kept in ``problems``)."""
        try:
            body = self.client.get(path)
            return None if body is None else parse(body, now)
        except MetadataError as exc:
            problems.append(str(exc))
            return Unreadable(str(exc))
