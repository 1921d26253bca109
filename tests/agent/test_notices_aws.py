"""AWS's notices: the pure parsers and watcher (with hypothesis), and the IMDSv2 client and source against the local
metadata service (spotmorph.local.aws_metadata), both clocks injected."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotmorph.local.aws_metadata import AwsMetadataServer, AwsMetadataState
from worker_agent.notices.aws import (
    INSTANCE_ACTION_PATH,
    MAX_POLL_SECONDS,
    NOTICE_SOURCE,
    REBALANCE_PATH,
    RISK_SOURCE,
    AwsMetadataClient,
    AwsNoticeSource,
    AwsWatcher,
    InstanceAction,
    Rebalance,
    parse_instance_action,
    parse_rebalance,
    parse_token,
)
from worker_agent.notices.facts import EvictionNoticed, EvictionRiskNoticed, EvictionRiskWithdrawn, EvictionWithdrawn
from worker_agent.notices.parsing import MetadataError, Unreadable

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
VM = "vm-1"


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_instance_action_is_read_with_its_time() -> None:
    body = json.dumps({"action": "terminate", "time": stamp(NOW + 120)}).encode()
    assert parse_instance_action(body, NOW) == InstanceAction("terminate", at(NOW + 120))
    stop = json.dumps({"action": "stop", "time": "2027-01-15T08:02:00+00:00"}).encode()
    assert parse_instance_action(stop, NOW).time == at(NOW + 120)
    naive = json.dumps({"action": "hibernate", "time": "2027-01-15T08:02:00"}).encode()
    assert parse_instance_action(naive, NOW).time == at(NOW + 120), "AWS writes UTC: a zoneless time is UTC"
    assert parse_rebalance(json.dumps({"noticeTime": stamp(NOW)}).encode(), NOW) == Rebalance(at(NOW))


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>oops</html>", "not JSON"),
        (b"[1, 2]", "an array, not an object"),
        (b"[" * 50_000, "not JSON"),
        (json.dumps({"action": "reboot", "time": stamp(NOW)}).encode(), "'reboot', not one of"),
        (json.dumps({"action": 7, "time": stamp(NOW)}).encode(), "a number, not one of"),
        (json.dumps({"action": "stop"}).encode(), "time is missing"),
        (json.dumps({"action": "stop", "time": "soon"}).encode(), "'soon' is not an ISO 8601 time"),
        (json.dumps({"action": "stop", "time": "9999-01-01T00:00:00Z"}).encode(), "not a plausible notice"),
        (json.dumps({"action": "stop", "time": "x" * 500}).encode(), "a string, not a time"),
    ],
)
def test_a_malformed_instance_action_is_a_clear_error(body: bytes, said: str) -> None:
    with pytest.raises(MetadataError, match=said):
        parse_instance_action(body, NOW)


def test_a_token_is_checked_before_it_goes_into_a_header_and_never_printed() -> None:
    assert parse_token(b"AQAEAFq_token-with.chars~==") == "AQAEAFq_token-with.chars~=="
    for bad in (b"", b"secret\r\nX-Evil: 1", b"a b", b"x" * 2000):
        with pytest.raises(MetadataError) as raised:
            parse_token(bad)
        assert "secret" not in str(raised.value) and "is not a token" in str(raised.value)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
TIMES = st.sampled_from([stamp(NOW + 120), "2027-01-15T08:02:00", "2027-01-15T08:02:00+09:00", "9999-12-31T23:59:59Z"])
FIELDS = st.dictionaries(
    st.sampled_from(["action", "time", "noticeTime"]), st.one_of(JSON, TIMES, st.sampled_from(["terminate", "stop"]))
)


@settings(suppress_health_check=[HealthCheck.too_slow])  # a loaded make test draws slowly; the inputs are small
@given(st.one_of(st.binary(max_size=300), FIELDS.map(lambda d: json.dumps(d).encode())))
def test_no_answer_makes_a_parser_raise_anything_but_a_metadata_error(body: bytes) -> None:
    for parse in (parse_instance_action, parse_rebalance):
        with contextlib.suppress(MetadataError):
            parse(body, NOW)
    with contextlib.suppress(MetadataError):
        parse_token(body)


def test_the_watcher_reports_each_change_once_and_an_unreadable_answer_withdraws_nothing() -> None:
    watcher = AwsWatcher()
    terminate = InstanceAction("terminate", at(NOW + 120))
    assert watcher.observe(None, None, NOW) == []
    noticed = watcher.observe(terminate, None, NOW)
    assert noticed == [
        EvictionNoticed("aws-terminate-20270115T080200Z", "terminate", "Scheduled", at(NOW + 120), NOTICE_SOURCE)
    ]
    assert watcher.observe(terminate, None, NOW + 1) == [], "reported once"
    assert watcher.observe(Unreadable("garbled"), Unreadable("garbled"), NOW + 2) == []
    moved = watcher.observe(InstanceAction("stop", at(NOW + 130)), None, NOW + 3)
    assert [type(f) for f in moved] == [EvictionWithdrawn, EvictionNoticed], "the old one first, then the new"
    assert watcher.observe(None, None, NOW + 4) == [
        EvictionWithdrawn("aws-stop-20270115T080210Z", "the instance-action is gone")
    ]


def test_the_watcher_reports_a_rebalance_recommendation_once_until_it_is_gone() -> None:
    watcher = AwsWatcher()
    risk = watcher.observe(None, Rebalance(at(NOW - 5)), NOW)
    assert risk == [EvictionRiskNoticed(RISK_SOURCE, NOW, "noticeTime 2027-01-15T07:59:55+00:00")]
    assert watcher.observe(None, Rebalance(at(NOW - 5)), NOW + 1) == []
    assert watcher.observe(None, Unreadable("x"), NOW + 2) == [], "an unreadable answer withdraws nothing"
    assert watcher.observe(None, None, NOW + 3) == [
        EvictionRiskWithdrawn(RISK_SOURCE, "the rebalance recommendation is gone")
    ]


ACTIONS = st.one_of(
    st.none(),
    st.builds(Unreadable, st.just("x")),
    st.builds(InstanceAction, st.sampled_from(["terminate", "stop"]), st.sampled_from([at(NOW + 60), at(NOW + 120)])),
)
REBALANCES = st.one_of(st.none(), st.builds(Unreadable, st.just("x")), st.just(Rebalance(at(NOW))))


@given(st.lists(st.tuples(ACTIONS, REBALANCES), max_size=30))
def test_the_facts_track_what_was_last_read(looks: list[tuple[object, object]]) -> None:
    """Replaying the facts gives the notice and risk the last readable answers said, whatever came in between."""
    watcher = AwsWatcher()
    notice: str | None = None
    risky = False
    for action, rebalance in looks:
        for fact in watcher.observe(action, rebalance, NOW):  # type: ignore[arg-type]
            if isinstance(fact, EvictionNoticed):
                assert notice is None, "a notice is withdrawn before another is reported"
                notice = fact.event_id
            elif isinstance(fact, EvictionWithdrawn):
                assert fact.event_id == notice
                notice = None
            elif isinstance(fact, EvictionRiskNoticed):
                assert not risky
                risky = True
            else:
                assert risky
                risky = False
    readable_actions = [a for a, _ in looks if not isinstance(a, Unreadable)]
    last = readable_actions[-1] if readable_actions else None
    assert (notice is None) == (last is None)
    if isinstance(last, InstanceAction):
        assert notice is not None and notice.startswith(f"aws-{last.action}-")
    readable_risks = [r for _, r in looks if not isinstance(r, Unreadable)]
    assert risky == bool(readable_risks and readable_risks[-1] is not None)


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def server(clock: Clock) -> Iterator[AwsMetadataServer]:
    srv = AwsMetadataServer(state=AwsMetadataState(clock)).start()
    yield srv
    srv.stop()


def test_the_client_keeps_its_token_renews_it_before_the_ttl_and_after_a_401(
    server: AwsMetadataServer, clock: Clock
) -> None:
    monotonic = Clock(0.0)
    client = AwsMetadataClient(f"{server.base_url}/{VM}", ttl_seconds=100, clock=monotonic)
    first = client.token()
    assert client.get(INSTANCE_ACTION_PATH) is None and client.token() == first, "404: nothing scheduled, same token"
    monotonic.now = 79.0
    assert client.token() == first
    monotonic.now = 81.0
    second = client.token()
    assert second != first, "renewed at 80% of its TTL"
    clock.now += 101  # the server's clock: the token has expired there, though the client thinks it fresh
    assert client.get(REBALANCE_PATH) is None, "a 401 gets a new token and one more try"
    assert client.token() != second


def test_the_source_reports_the_interruption_and_the_rebalance_recommendation(
    server: AwsMetadataServer, clock: Clock
) -> None:
    source = AwsNoticeSource(AwsMetadataClient(f"{server.base_url}/{VM}"), poll_seconds=5.0, wall_clock=clock)
    quiet = source.poll()
    assert quiet.facts == () and quiet.wait == MAX_POLL_SECONDS, "at least every 2 s, whatever was asked"
    server.state.recommend_rebalance(VM)
    server.state.schedule("vm-2", "terminate", 120)  # another VM's: not this one's business
    assert [type(f) for f in source.poll().facts] == [EvictionRiskNoticed]
    server.state.schedule(VM, "terminate", 120)
    (notice,) = source.poll().facts
    assert isinstance(notice, EvictionNoticed) and notice.not_before == at(NOW + 120)
    assert notice.source == NOTICE_SOURCE and notice.event_type == "terminate"
    server.state.withdraw_rebalance(VM)
    assert [type(f) for f in source.poll().facts] == [EvictionRiskWithdrawn]


def test_a_source_whose_service_is_gone_or_garbled_reports_nothing_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = AwsNoticeSource(AwsMetadataClient("http://127.0.0.1:9", timeout_seconds=0.5))
    assert source.poll().facts == ()
    assert "aws metadata: PUT /latest/api/token: connection failed" in caplog.text

    class Broken(AwsMetadataClient):
        def get(self, path: str) -> bytes | None:
            raise KeyError(path)

    assert AwsNoticeSource(Broken()).poll().facts == ()
    assert "unexpected KeyError" in caplog.text
