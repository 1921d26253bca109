"""Trainer logs through a real controller: ReportLogs in, WatchLogs out, every refusal with its precise code.

A node sends only as itself and its current incarnation, only ranks its generation placed on it, chunks
that continue its files exactly (a gap is answered with the offset wanted) and at most 256 KiB at once.
WatchLogs reads back what was kept, filtered by rank and generation, from a cursor; a follower gets new
lines as they are stored and its stream ends once the job ended and went quiet (on the controller's clock).
Log writes and reads run off the event loop and never wait for the decision lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.core import logs
from controller.persistence.store import Store
from controller.shell.logbook import LogBook
from protos.reasons import REGISTER_AGAIN, reason_of
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.conftest import Live, running
from tests.controller.test_hostile_edge import Node, running_job, wait_for
from tests.controller.test_logs_store import _two_generations

CODE = grpc.StatusCode


def send(node: Node, *chunks: pb.LogChunk, name: str | None = None, incarnation: int | None = None) -> list[int]:
    request = pb.ReportLogsRequest(
        node_name=node.name if name is None else name,
        incarnation=node.incarnation if incarnation is None else incarnation,
        chunks=chunks,
    )
    return [o.offset for o in node.stub.ReportLogs(request, timeout=10).offsets]


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details() or ""


def watch(live: Live, job: str, **fields: Any) -> list[pb.LogLine]:
    return list(live.jobs("reader").WatchLogs(pb.WatchLogsRequest(job=job, **fields), timeout=10))


def texts(lines: list[pb.LogLine]) -> list[str]:
    return [line.text for line in lines]


def test_lines_come_back_in_order_filtered_and_from_a_cursor(live_clock: Live) -> None:
    live = live_clock
    assert live.clock is not None
    node, job, generation = running_job(live)
    ranks = list(node.beat().assignment.ranks)
    live.clock.at += 5
    first = pb.LogChunk(job=job, generation=generation, rank=ranks[0], offset=0, text=b"hello\nwor")
    assert send(node, first) == [9]
    rest = pb.LogChunk(job=job, generation=generation, rank=ranks[0], offset=6, text=b"world\nTraceback\n")
    assert send(node, rest) == [22]  # "wor" again: trimmed, not repeated
    lines = watch(live, job)
    assert texts(lines) == ["hello", "world", "Traceback"]
    assert {(x.generation, x.rank, x.node, x.at) for x in lines} == {(generation, ranks[0], node.name, live.clock.at)}
    assert texts(watch(live, job, after=lines[0].id)) == ["world", "Traceback"]
    if len(ranks) > 1:
        send(node, pb.LogChunk(job=job, generation=generation, rank=ranks[1], offset=0, text=b"other rank\n"))
        assert texts(watch(live, job, rank=ranks[1])) == ["other rank"]
    assert texts(watch(live, job, rank=ranks[0], generation=generation)) == ["hello", "world", "Traceback"]
    assert watch(live, job, rank=ranks[0] + 1000) == []
    end = pb.LogChunk(job=job, generation=generation, rank=ranks[0], offset=22, text=b"no newline", eof=True)
    assert send(node, end) == [32]
    assert texts(watch(live, job, rank=ranks[0]))[-1] == "no newline"  # the file's last line, kept at its end


def test_refusals_name_the_field_and_keep_nothing(live: Live) -> None:
    node, job, generation = running_job(live)
    rank = node.beat().assignment.ranks[0]

    def chunk(**fields: Any) -> pb.LogChunk:
        return pb.LogChunk(
            **{"job": job, "generation": generation, "rank": rank, "offset": 0, "text": b"x\n", **fields}
        )

    other = Node(live)  # registered, runs nothing
    code, detail = refused(lambda: send(node, chunk(), name=other.name))  # as another node
    assert code == CODE.PERMISSION_DENIED and other.name in detail
    code, detail = refused(lambda: send(other, chunk()))  # a rank it did not run
    assert code == CODE.PERMISSION_DENIED and "chunks[0].rank" in detail and other.name in detail
    code, detail = refused(lambda: send(node, chunk(rank=4000)))  # a rank the generation does not have
    assert code == CODE.PERMISSION_DENIED and "chunks[0].rank" in detail
    code, detail = refused(lambda: send(node, chunk(job="job-404")))
    assert code == CODE.NOT_FOUND and "chunks[0].job" in detail
    code, detail = refused(lambda: send(node, chunk(generation=generation + 1)))
    assert code == CODE.FAILED_PRECONDITION and "chunks[0].generation" in detail
    code, detail = refused(lambda: send(node, chunk(generation=0)))
    assert code == CODE.INVALID_ARGUMENT and "chunks[0].generation" in detail
    code, detail = refused(lambda: send(node, chunk(offset=2**63)))
    assert code == CODE.INVALID_ARGUMENT and "chunks[0].offset" in detail
    code, detail = refused(lambda: send(node, chunk(), chunk(offset=2, text=b"y\n")))
    assert code == CODE.INVALID_ARGUMENT and "chunks[1].rank" in detail and "twice" in detail
    too_much = chunk(text=b"y" * (logs.MAX_REQUEST_BYTES + 1))
    code, detail = refused(lambda: send(node, too_much))
    assert code == CODE.RESOURCE_EXHAUSTED and "256 KiB" in detail
    code, detail = refused(lambda: send(node, *[chunk(job=f"j{i}") for i in range(logs.MAX_CHUNKS + 1)]))
    assert code == CODE.RESOURCE_EXHAUSTED and str(logs.MAX_CHUNKS) in detail
    assert watch(live, job) == []  # nothing of a refused call was kept
    assert send(node, chunk(offset=5)) == [0]  # a gap: not taken, answered with the offset wanted
    assert watch(live, job) == []
    assert send(node, chunk(text=b"y" * (logs.MAX_REQUEST_BYTES - 1) + b"\n")) == [logs.MAX_REQUEST_BYTES]
    [line] = watch(live, job)
    assert line.text.endswith(logs.cut_marker(logs.MAX_REQUEST_BYTES - 1 - logs.MAX_LINE_BYTES))


def test_a_stale_incarnation_is_refused_until_it_registers_again(live: Live) -> None:
    node, job, generation = running_job(live)
    rank = node.beat().assignment.ranks[0]
    chunk = pb.LogChunk(job=job, generation=generation, rank=rank, offset=0, text=b"before\n")
    assert send(node, chunk) == [7]
    again = Node(live, name=node.name, instance=node.vm)  # the same VM's agent restarted: a new incarnation
    with pytest.raises(grpc.RpcError) as info:
        send(node, chunk)
    assert info.value.code() == CODE.FAILED_PRECONDITION and "register again" in (info.value.details() or "")
    assert reason_of(info.value.trailing_metadata()) == REGISTER_AGAIN  # the word the agent decides on
    unknown = pb.LogChunk(job=job, generation=generation + 5, rank=rank, offset=0, text=b"x\n")
    with pytest.raises(grpc.RpcError) as info:
        send(again, unknown)  # FAILED_PRECONDITION too, but no reason to register again
    assert info.value.code() == CODE.FAILED_PRECONDITION and reason_of(info.value.trailing_metadata()) == ""
    assert send(again, pb.LogChunk(job=job, generation=generation, rank=rank)) == [7]  # asks: resumes exactly
    assert send(again, pb.LogChunk(job=job, generation=generation, rank=rank, offset=7, text=b"after\n")) == [13]
    assert texts(watch(live, job)) == ["before", "after"]


def test_watch_logs_refuses_what_cannot_have_lines(live: Live) -> None:
    _, job, generation = running_job(live)
    stub = live.jobs("reader")
    for request, code, field in [
        (pb.WatchLogsRequest(job="job-404"), CODE.NOT_FOUND, "job-404"),
        (pb.WatchLogsRequest(), CODE.INVALID_ARGUMENT, "job"),
        (pb.WatchLogsRequest(job="bad name\x1b"), CODE.INVALID_ARGUMENT, "job"),
        (pb.WatchLogsRequest(job=job, generation=0), CODE.INVALID_ARGUMENT, "generation"),
        (pb.WatchLogsRequest(job=job, generation=generation + 1), CODE.INVALID_ARGUMENT, "generation"),
        (pb.WatchLogsRequest(job=job, after=2**63), CODE.INVALID_ARGUMENT, "after"),
        (pb.WatchLogsRequest(job=job, rank=2**32 - 1), CODE.INVALID_ARGUMENT, "rank"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            list(stub.WatchLogs(request, timeout=10))
        got, detail = info.value.code(), info.value.details() or ""
        assert (got, field in detail) == (code, True), (request, got, detail)


def test_a_follower_gets_new_lines_and_its_stream_ends_once_the_job_ended_and_went_quiet(live_clock: Live) -> None:
    live = live_clock
    assert live.clock is not None
    node, job, generation = running_job(live)
    rank = node.beat().assignment.ranks[0]
    assert send(node, pb.LogChunk(job=job, generation=generation, rank=rank, offset=0, text=b"one\n")) == [4]
    with live.channel(live.token("reader")) as channel:
        follower: Iterator[pb.LogLine] = iter(
            rpc.JobsStub(channel).WatchLogs(pb.WatchLogsRequest(job=job, follow=True), timeout=30)
        )
        assert next(follower).text == "one"
        send(node, pb.LogChunk(job=job, generation=generation, rank=rank, offset=4, text=b"two\n"))
        assert next(follower).text == "two"  # woken by the append
        live.jobs().CancelJob(pb.CancelJobRequest(id=job))
        send(node, pb.LogChunk(job=job, generation=generation, rank=rank, offset=8, text=b"last words\n"))
        assert next(follower).text == "last words"  # lines still come after the job ended
        live.clock.at += live.controller.view.heartbeat_expiry_seconds
        send(node, pb.LogChunk(job=job, generation=generation, rank=rank, offset=19))  # wakes it: nothing new
        assert list(follower) == []  # ended and quiet: the stream ends by itself
    # A follower of a job that ended long ago gets what is kept, and its stream ends at once.
    following = live.jobs("reader").WatchLogs(pb.WatchLogsRequest(job=job, follow=True), timeout=30)
    assert texts(list(following)) == ["one", "two", "last words"]


def test_log_writes_and_reads_run_off_the_event_loop_and_never_wait_for_decisions(live: Live) -> None:
    node, job, generation = running_job(live)
    rank = node.beat().assignment.ranks[0]

    async def loop_thread() -> threading.Thread:
        return threading.current_thread()

    on_loop = live.run(loop_thread())
    store = live.controller.store
    calls: list[tuple[str, threading.Thread]] = []
    for name in ("append_logs", "log_lines"):
        method: Callable[..., Any] = getattr(store, name)

        def recorded(*args: Any, _name: str = name, _method: Callable[..., Any] = method) -> Any:
            calls.append((_name, threading.current_thread()))
            return _method(*args)

        setattr(store, name, recorded)
    lock = live.controller.runner.lock
    live.run(lock.acquire())  # a decision in progress, as long as it takes
    try:
        chunk = pb.LogChunk(job=job, generation=generation, rank=rank, offset=0, text=b"while deciding\n")
        assert send(node, chunk) == [15]
        assert texts(watch(live, job)) == ["while deciding"]
    finally:
        live.loop.call_soon_threadsafe(lock.release)
    assert {name for name, _ in calls} == {"append_logs", "log_lines"}
    assert [name for name, thread in calls if thread is on_loop] == []


def test_follow_streams_are_bounded_per_caller_and_in_all(tmp_path: Path) -> None:
    """Issue 44: a thousand follow streams once slowed another node's heartbeats (p99 2.5 s)."""
    with running(tmp_path, max_log_followers=3, max_log_followers_per_caller=2) as live:
        node, job, generation = running_job(live)
        rank = node.beat().assignment.ranks[0]
        send(node, pb.LogChunk(job=job, generation=generation, rank=rank, offset=0, text=b"one\n"))

        def follow(role: str) -> Any:
            stream = live.jobs(role).WatchLogs(pb.WatchLogsRequest(job=job, follow=True), timeout=30)
            assert next(iter(stream)).text == "one"  # admitted: it streams
            return stream

        readers = [follow("reader"), follow("reader")]
        code, detail = refused(lambda: follow("reader"))
        assert code == CODE.RESOURCE_EXHAUSTED and "the most one may (2)" in detail, detail
        assert texts(watch(live, job)) == ["one"]  # a read that does not follow is not counted
        operator = follow("operator")
        code, detail = refused(lambda: follow("operator"))
        assert code == CODE.RESOURCE_EXHAUSTED and "the most it may" in detail, detail
        readers.pop().cancel()  # a stream that ends gives its place back
        wait_for(lambda: live.controller.followers.active == 2, "the cancelled stream to be let go")
        readers.append(follow("reader"))
        for stream in (*readers, operator):
            stream.cancel()


def test_a_follower_is_woken_only_by_its_own_jobs_lines(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    node, ranks = next(iter(_two_generations(store).items()))

    async def scenario() -> None:
        book = LogBook(store)
        mine, other = book.next_change("job-1"), book.next_change("job-2")
        await book.append(node, [logs.LogChunk("job-1", 1, ranks[0], 0, b"y\n")], 2.0)
        assert mine.is_set() and not other.is_set()
        assert book.next_change("job-1") is not mine  # a fresh one for the next wait
        book.close()

    asyncio.run(scenario())


def test_a_vm_that_took_a_lost_nodes_name_cannot_append_to_the_old_nodes_logs(live_clock: Live) -> None:
    """Issue 44: the log streams of a generation belong to the VM that ran it. Another VM that registers under a
    LOST node's name is refused the old generation's logs (PERMISSION_DENIED); the same VM's restarted agent is
    not (test_a_stale_incarnation_is_refused_until_it_registers_again)."""
    live = live_clock
    assert live.clock is not None
    node, job, generation = running_job(live)
    rank = node.beat().assignment.ranks[0]
    assert send(node, pb.LogChunk(job=job, generation=generation, rank=rank, offset=0, text=b"mine\n")) == [5]
    live.clock.at += live.controller.view.heartbeat_expiry_seconds + 1
    live.run(live.controller.runner.tick())
    wait_for(lambda: live.controller.view.node(node.name).state == "LOST", "the node to be LOST")  # type: ignore[union-attr]
    other = Node(live, name=node.name, instance="vm-other")  # another VM takes the name
    code, detail = refused(
        lambda: send(other, pb.LogChunk(job=job, generation=generation, rank=rank, offset=5, text=b"forged\n"))
    )
    assert code == CODE.PERMISSION_DENIED and "chunks[0].generation" in detail and "took the name" in detail, detail
    assert texts(watch(live, job)) == ["mine"]
