"""Trainer logs in the store: lines cut from byte streams at exact offsets, the cursor, the bound per job.

The pure rules (:func:`controller.core.logs.take`) first: overlaps trimmed, gaps not taken, partial lines
carried to the next chunk, Windows line ends, bytes that are not UTF-8, overlong lines cut at a character
boundary with a marker, and the end of a file without a newline. Then the store, on SQLite and on PostgreSQL:
a node may append only the ranks its generation placed on it, ids only grow (also past deleted lines), a
job keeps its newest 10,000 lines and 4 MiB; and a SQLite state directory of schema 5 gains the tables.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, inspect, text

from controller.core import logs
from controller.core.causes import MorphCause
from controller.core.logs import LogChunk, LogStream, NotRun, take
from controller.core.model import StartGeneration, ranks_by_node
from controller.core.records import CheckpointRef
from controller.persistence.schema import log_streams
from controller.persistence.store import MIGRATIONS, SCHEMA_VERSION, Store, migrate
from tests.controller.test_store import _running_world


def chunk(offset: int, data: bytes, eof: bool = False, rank: int = 0, generation: int = 1) -> LogChunk:
    return LogChunk("job-1", generation, rank, offset, data, eof)


def test_lines_come_whole_from_chunks_cut_anywhere() -> None:
    text = b"first line\nsecond \xc3\xa9\r\nthird"
    for cut in range(len(text) + 1):
        one = take(LogStream(), chunk(0, text[:cut]))
        two = take(one.stream, chunk(cut, text[cut:]))
        assert one.lines + two.lines == ("first line", "second é"), cut
        assert two.stream == LogStream(len(text), b"third", 0)
    assert take(two.stream, chunk(len(text), b"", eof=True)).lines == ("third",)  # the end of the file, no newline


def test_an_overlap_is_trimmed_and_a_gap_is_not_taken() -> None:
    held = take(LogStream(), chunk(0, b"a\nbb\ncc")).stream  # has 7 bytes, "cc" pending
    again = take(held, chunk(2, b"bb\ncc\ndd\n"))  # starts inside what it has: only "\ndd\n" is new
    assert again.lines == ("cc", "dd") and again.stream == LogStream(11, b"", 0)
    assert take(again.stream, chunk(0, b"a\n")) == logs.Taken(again.stream, ())  # all old: nothing, same offset
    gap = take(again.stream, chunk(12, b"late\n"))
    assert gap == logs.Taken(again.stream, ()) and gap.stream.offset == 11  # the offset wanted
    assert take(again.stream, chunk(3, b"", eof=True)).lines == ()  # an "end" before what it has closes nothing


def test_text_that_is_not_utf8_is_kept_with_replacement_characters() -> None:
    taken = take(LogStream(), chunk(0, b"ok \xff\xfe bytes\n\xe2\x82\n"))
    assert taken.lines == ("ok \ufffd\ufffd bytes", "\ufffd")


def test_an_overlong_line_keeps_its_start_cut_at_a_character_boundary_and_says_how_much_was_cut() -> None:
    limit = logs.MAX_LINE_BYTES
    line = b"x" * (limit - 1) + "é".encode() + b"y" * 100  # the é straddles the limit
    whole = len(line)
    stream = LogStream()
    lines: list[str] = []
    for start in range(0, whole, 4096):  # arriving in pieces, the dropped part is counted, not kept
        taken = take(stream, chunk(start, line[start : start + 4096]))
        stream, lines = taken.stream, lines + list(taken.lines)
        assert len(stream.pending) <= limit
    assert lines == [] and stream.cut == whole - limit
    [text] = take(stream, chunk(whole, b"\nnext")).lines
    assert text == "x" * (limit - 1) + logs.cut_marker(whole - (limit - 1))
    assert text.encode().startswith(b"x" * (limit - 1)) and "\ufffd" not in text
    exact = b"z" * limit + b"\n"
    assert take(LogStream(), chunk(0, exact)).lines == ("z" * limit,)  # at the limit: kept whole


def test_pruning_drops_the_oldest_until_both_bounds_hold() -> None:
    rows = [(i, 100) for i in range(1, 20)]
    assert logs.prune(iter(rows), logs.MAX_JOB_LINES + 3, 1900) == logs.Kept(3, logs.MAX_JOB_LINES, 1600)
    big = [(i, 1 << 20) for i in range(1, 10)]
    assert logs.prune(iter(big), 6, 6 << 20) == logs.Kept(2, 4, 4 << 20)
    assert logs.prune(iter(rows), 5, 500) == logs.Kept(None, 5, 500)


def _two_generations(store: Store) -> dict[str, tuple[int, ...]]:
    """job-1 with generations 1 and 2 (the same layout); its ranks by node."""
    world = _running_world(store)
    layout = world.jobs["job-1"].layout
    assert layout is not None
    store.persist([StartGeneration("job-1", 2, layout, CheckpointRef(), MorphCause.GROW, "grow", None, 2.0)])
    return dict(ranks_by_node(layout))


def test_a_node_appends_only_the_ranks_its_generations_placed_on_it(store_target: Path | str) -> None:
    store = Store(store_target)
    placed = _two_generations(store)
    node, ranks = next(iter(placed.items()))
    stranger = next((r for r in range(8) if r not in ranks), None)
    assert stranger is not None
    assert store.append_logs(node, [chunk(0, b"one\n", rank=ranks[0])], 5.0) == [4]
    for bad in (
        chunk(0, b"x\n", rank=stranger),  # another node's rank, or none
        chunk(0, b"x\n", rank=ranks[0], generation=3),  # a generation never issued has no placement
    ):
        with pytest.raises(NotRun, match=r"chunks\[1\]\.rank"):
            store.append_logs(node, [chunk(4, b"two\n", rank=ranks[0]), bad], 6.0)
    with pytest.raises(NotRun):
        store.append_logs("node-9", [chunk(0, b"x\n", rank=ranks[0])], 6.0)
    assert [line.text for line in store.log_lines("job-1")] == ["one"]  # a refused call keeps nothing of it
    assert store.append_logs(node, [chunk(4, b"two\n", rank=ranks[0])], 6.0) == [8]


def test_the_cursor_filters_and_keeps_growing_past_deleted_lines(store_target: Path | str) -> None:
    store = Store(store_target)
    placed = _two_generations(store)
    node, ranks = next(iter(placed.items()))
    rank = ranks[0]
    store.append_logs(node, [chunk(0, b"g1 a\ng1 b\n", rank=rank), chunk(0, b"g2 a\n", rank=rank, generation=2)], 7.0)
    lines = store.log_lines("job-1")
    assert [(line.generation, line.rank, line.node, line.at, line.text) for line in lines] == [
        (1, rank, node, 7.0, "g1 a"),
        (1, rank, node, 7.0, "g1 b"),
        (2, rank, node, 7.0, "g2 a"),
    ]
    ids = [line.id for line in lines]
    assert ids == sorted(set(ids))
    assert [line.text for line in store.log_lines("job-1", after=ids[0])] == ["g1 b", "g2 a"]
    assert [line.text for line in store.log_lines("job-1", generation=2)] == ["g2 a"]
    assert store.log_lines("job-1", rank=rank + 100) == [] and store.log_lines("job-2") == []
    assert [line.text for line in store.log_lines("job-1", limit=1)] == ["g1 a"]
    with store.engine.begin() as conn:  # even with the newest line gone, no id is handed out again
        conn.execute(text("DELETE FROM log_lines WHERE id = :id"), {"id": ids[-1]})
    store.append_logs(node, [chunk(5, b"g2 b\n", rank=rank, generation=2)], 8.0)
    assert store.log_lines("job-1", after=ids[1])[0].id > ids[-1]


def test_a_job_keeps_its_newest_lines_within_both_bounds(store_target: Path | str) -> None:
    store = Store(store_target)
    placed = _two_generations(store)
    node, ranks = next(iter(placed.items()))
    rank = ranks[0]
    many = b"".join(b"line %d\n" % i for i in range(logs.MAX_JOB_LINES + 500))
    offset = 0
    for start in range(0, len(many), 64 << 10):
        piece = many[start : start + (64 << 10)]
        [offset] = store.append_logs(node, [chunk(offset, piece, rank=rank)], 9.0)
    kept = store.log_lines("job-1", limit=2 * logs.MAX_JOB_LINES)
    assert len(kept) == logs.MAX_JOB_LINES
    assert (kept[0].text, kept[-1].text) == ("line 500", f"line {logs.MAX_JOB_LINES + 499}")
    wide = b"w" * (logs.MAX_LINE_BYTES - 1) + b"\n"  # 16 KiB a line: the bytes bound comes first
    count = (logs.MAX_JOB_BYTES // len(wide)) + 40
    for i in range(count):
        [offset] = store.append_logs(node, [chunk(i * len(wide), wide, rank=rank, generation=2)], 10.0)
    kept = store.log_lines("job-1", limit=2 * logs.MAX_JOB_LINES)
    assert sum(len(line.text.encode()) for line in kept) <= logs.MAX_JOB_BYTES
    assert len(kept) == logs.MAX_JOB_BYTES // (logs.MAX_LINE_BYTES - 1)  # as many as fit, the newest
    assert all(line.generation == 2 for line in kept) and offset == count * len(wide)


def test_a_stream_past_4_gib_appends_on(store_target: Path | str) -> None:
    """A rank's log offsets are 64 bits (SQLite's INTEGER; PostgreSQL's BIGINT): a long run's log passes 2**32."""
    store = Store(store_target)
    node, ranks = next(iter(_two_generations(store).items()))
    far = 1 << 32
    with store.engine.begin() as conn:  # as if 4 GiB of the rank's log came before
        row = {"job": "job-1", "generation": 1, "rank": ranks[0], "node": node, "offset": far, "pending": b"", "cut": 0}
        conn.execute(log_streams.insert().values(**row))
    assert store.append_logs(node, [chunk(far, b"late\n", rank=ranks[0])], 1.0) == [far + 5]
    assert [line.text for line in store.log_lines("job-1")] == ["late"]


def test_a_schema_5_state_directory_gains_the_log_tables(tmp_path: Path) -> None:
    """SQLite only: a database of schema 5 exists only as a SQLite file (PostgreSQL came with schema 17)."""
    path = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{path}")
    migrate(engine, MIGRATIONS[:5])
    with engine.begin() as conn:  # as a controller of schema 5 left it: no log tables
        for table in ("log_lines", "log_streams", "log_jobs"):
            conn.execute(text(f"DROP TABLE {table}"))
    engine.dispose()
    store = Store(path)
    assert store.schema_version() >= 6 and store.schema_version() == SCHEMA_VERSION
    tables = set(inspect(store.engine).get_table_names())
    assert {"log_lines", "log_streams", "log_jobs"} <= tables
    indexes = {i["name"] for i in inspect(store.engine).get_indexes("log_lines")}
    assert "log_lines_by_job" in indexes
    placed = _two_generations(store)
    node, ranks = next(iter(placed.items()))
    assert store.append_logs(node, [chunk(0, b"hello\n", rank=ranks[0])], 1.0) == [6]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, logs.MAX_LINE_BYTES), max_size=40), st.integers(0, 3), st.integers(0, 1 << 22))
def test_the_lines_inserted_are_those_the_pruning_keeps(sizes: list[int], scale: int, held: int) -> None:
    """Lines left out before the insert are exactly the ones :func:`logs.prune` would delete right after it,
    whatever the job already holds (older lines go first)."""
    sizes = [s << (scale * 4) for s in sizes]  # some requests past the bytes bound
    start = logs.newest_that_fit(sizes)
    existing = [(i, held // 8) for i in range(8)]  # eight older lines
    new = [(100 + i, s) for i, s in enumerate(sizes)]
    kept = logs.prune(existing + new, len(existing) + len(new), sum(s for _, s in existing + new))
    survivors = [i for i, _ in new if kept.last_dropped is None or i > kept.last_dropped]
    assert survivors == [100 + i for i in range(start, len(sizes))]


def test_a_request_of_blank_lines_inserts_no_more_than_the_job_keeps(store_target: Path | str) -> None:
    """256 KiB of empty lines (262,144 of them) once inserted every one and then deleted all but 10,000: ids,
    which grow with every line inserted, show that no more than what is kept was inserted."""
    store = Store(store_target)
    node, ranks = next(iter(_two_generations(store).items()))
    blank = b"\n" * logs.MAX_REQUEST_BYTES
    assert store.append_logs(node, [chunk(0, blank, rank=ranks[0])], 5.0) == [len(blank)]
    kept = store.log_lines("job-1", limit=2 * logs.MAX_JOB_LINES)
    assert len(kept) == logs.MAX_JOB_LINES and all(line.text == "" for line in kept)
    assert max(line.id for line in kept) == logs.MAX_JOB_LINES
