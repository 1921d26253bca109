from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from morphing.errors import UserInputError
from morphing.traces import parse_trace

SHIPPED = Path(__file__).resolve().parents[2] / "examples" / "traces" / "aws-p3-spot.csv"


def test_shipped_trace_reads_as_events() -> None:
    trace = parse_trace(SHIPPED.read_text())
    assert trace.shape == "events"
    assert 11 < trace.duration_seconds / 3600 < 12
    counts = [n for _, n in trace.availability()]
    assert max(counts) >= 30
    assert min(counts) >= 0


def test_three_shapes_give_the_same_availability() -> None:
    events = "0,add,a\n0,add,b\n60000,add,c\n120000,remove,a\n"
    counts = json.dumps({"metadata": {"gap_seconds": 60}, "data": [2, 3, 2]})
    dated = "2024-01-01, 00:00:00, 2\n2024-01-01, 00:01:00, 3\n2024-01-01, 00:02:00, 2\n"

    def by_time(text: str) -> list[tuple[float, int]]:
        final: dict[float, int] = {}
        for seconds, count in parse_trace(text).availability():
            final[seconds] = count
        return sorted(final.items())

    assert by_time(events) == by_time(counts) == by_time(dated) == [(0.0, 2), (60.0, 3), (120.0, 2)]
    assert parse_trace(counts).shape == "counts-json"
    assert parse_trace(dated).shape == "dated-counts"


@given(st.lists(st.integers(0, 40), min_size=1, max_size=50), st.integers(1, 3600))
def test_counts_round_trip(counts: list[int], gap: int) -> None:
    trace = parse_trace(json.dumps({"metadata": {"gap_seconds": gap}, "data": counts}))
    final: dict[float, int] = {0.0: 0}
    for seconds, count in trace.availability():
        final[seconds] = count
    for i, count in enumerate(counts):
        at = max(t for t in final if t <= i * gap)
        assert final[at] == count


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty"),
        ("hello world\n", "cannot tell the format"),
        ("0,add,a\n10,explode,b\n", "line 2"),
        ("100,add,a\n50,add,b\n", "time goes backwards"),
        ("x,add,a\n", "not a time"),
        ('{"data": [1, 2]}', "gap_seconds"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "gap_seconds must be > 0"),
        ("2024-01-01, 00:00:00, -3\n", "must be >= 0"),
        ("2024-01-01, noon, 3\n", "YYYY-MM-DD"),
    ],
)
def test_bad_traces_name_the_problem(text: str, expected: str) -> None:
    with pytest.raises(UserInputError, match=expected):
        parse_trace(text)


def test_duplicate_adds_and_unknown_removes_are_ignored() -> None:
    trace = parse_trace("0,add,a\n1,add,a\n2,remove,zz\n3,remove,a\n")
    assert [(e.kind, e.node) for e in trace.events] == [("add", "a"), ("remove", "a")]
