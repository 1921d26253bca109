"""The agent's log shipper on real files: every byte of every generation's log reaches the controller once.

Against a fake controller that keeps streams by the controller's own rules (:func:`controller.core.logs.take`):
calls stay within 256 KiB, files found at the start are asked about first (a restarted agent resumes where the
controller is), a gap is sent again from the offset wanted, a file is left alone once its trainer exited and its
end was taken, a refused file is dropped while the others go on, and an unreachable controller loses nothing
and is logged once. Then against a real controller, through the real transport.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from controller.core.logs import LogChunk as ControllerChunk
from controller.core.logs import LogStream, take
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import running
from tests.controller.test_contract import spec
from worker_agent.agent.converge import TrainerKey
from worker_agent.agent.logs import MAX_CALL_BYTES, LogShipper, shares
from worker_agent.agent.transport import CallRefused, ControllerLink, ControllerUnreachable, Endpoint
from worker_agent.agent.wire import LogChunk, Registration
from worker_agent.contract import TrainersDir

GEN1, GEN2 = TrainerKey("job-1", 1, 0), TrainerKey("job-1", 2, 0)


class FakeController:
    """ReportLogs as the controller answers it; ``outages`` calls fail first, ``refused`` keys are refused."""

    def __init__(self) -> None:
        self.streams: dict[TrainerKey, LogStream] = {}
        self.lines: dict[TrainerKey, list[str]] = {}
        self.calls: list[list[LogChunk]] = []
        self.outages = 0
        self.refused: set[TrainerKey] = set()

    async def send(self, chunks: list[LogChunk]) -> list[int]:
        self.calls.append(list(chunks))
        assert sum(len(c.data) for c in chunks) <= MAX_CALL_BYTES
        assert len({c.key for c in chunks}) == len(chunks), "each file once a call"
        if self.outages:
            self.outages -= 1
            raise ControllerUnreachable("UNAVAILABLE")
        for i, c in enumerate(chunks):
            if c.key in self.refused:
                raise CallRefused("ReportLogs", "PERMISSION_DENIED", f"chunks[{i}].rank: not yours")
        offsets = []
        for c in chunks:
            k = c.key
            taken = take(
                self.streams.get(k, LogStream()),
                ControllerChunk(k.job_id, k.generation, k.rank, c.offset, c.data, c.eof),
            )
            self.streams[k] = taken.stream
            self.lines.setdefault(k, []).extend(taken.lines)
            offsets.append(taken.stream.offset)
        return offsets


def log_file(trainers: TrainersDir, key: TrainerKey) -> Path:
    directory = trainers.generation_dir(key.job_id, key.generation)
    directory.path.mkdir(parents=True, exist_ok=True)
    return directory.log_file(key.rank)


def append(path: Path, text: str) -> None:
    with path.open("a") as out:
        out.write(text)


def shipper(trainers: TrainersDir, controller: FakeController, running: set[TrainerKey]) -> LogShipper:
    return LogShipper(trainers, controller.send, lambda: set(running))


def rounds(ship: LogShipper, count: int) -> list[int]:
    async def go() -> list[int]:
        return [await ship.ship() for _ in range(count)]

    return asyncio.run(go())


def test_every_generation_reaches_the_controller_whole_in_bounded_calls(tmp_path: Path) -> None:
    trainers, controller = TrainersDir(tmp_path / "trainers"), FakeController()
    old = [f"gen 1 line {i} " + "x" * 80 for i in range(8000)]  # ~700 KiB: three calls' worth
    append(log_file(trainers, GEN1), "".join(f"{line}\n" for line in old))  # its trainer exited
    append(log_file(trainers, GEN2), "started\n")
    running = {GEN2}
    ship = shipper(trainers, controller, running)
    rounds(ship, 1)
    assert [(c.key, c.offset, c.data) for c in controller.calls[0]] == [(GEN1, 0, b""), (GEN2, 0, b"")]  # asked first
    rounds(ship, 1)
    assert controller.lines[GEN2] == ["started"]  # the small file is not starved by the big one
    append(log_file(trainers, GEN2), "more\npartial")
    rounds(ship, 4)
    assert controller.lines[GEN1] == old and GEN1 in ship.finished and GEN1 not in ship.pending()
    assert controller.lines[GEN2] == ["started", "more"] and GEN2 in ship.pending()
    assert all(len(c.data) <= MAX_CALL_BYTES for call in controller.calls for c in call)
    running.clear()  # generation 2's trainer exits: its last line has no newline
    rounds(ship, 2)
    assert controller.lines[GEN2] == ["started", "more", "partial"] and GEN2 in ship.finished
    calls = len(controller.calls)
    rounds(ship, 3)
    assert len(controller.calls) == calls, "files sent to their end are left alone"


def test_a_restarted_agent_asks_first_and_resumes_exactly(tmp_path: Path) -> None:
    trainers, controller = TrainersDir(tmp_path / "trainers"), FakeController()
    path = log_file(trainers, GEN1)
    append(path, "a\nb\n")
    rounds(shipper(trainers, controller, {GEN1}), 2)
    append(path, "c\n")
    restarted = shipper(trainers, controller, set())  # a new agent: it knows nothing of what was sent
    rounds(restarted, 3)
    assert controller.calls[2] == [LogChunk(GEN1, 0, b"")]
    assert controller.calls[3] == [LogChunk(GEN1, 4, b"c\n", eof=True)]
    assert controller.lines[GEN1] == ["a", "b", "c"] and GEN1 in restarted.finished


def test_a_gap_is_sent_again_from_the_offset_the_controller_wants(tmp_path: Path) -> None:
    trainers, controller = TrainersDir(tmp_path / "trainers"), FakeController()
    path = log_file(trainers, GEN2)
    append(path, "one\ntwo\n")
    ship = shipper(trainers, controller, {GEN2})
    rounds(ship, 2)
    controller.streams[GEN2] = LogStream(4)  # the controller has less than it had (restored from a backup)
    controller.lines[GEN2] = ["one"]
    append(path, "three\n")
    rounds(ship, 1)
    assert controller.calls[-1][0].offset == 8 and controller.lines[GEN2] == ["one"]  # a gap: not taken
    rounds(ship, 1)
    assert controller.calls[-1][0].offset == 4 and controller.lines[GEN2] == ["one", "two", "three"]


def test_a_refused_file_is_dropped_and_the_others_go_on(tmp_path: Path) -> None:
    trainers, controller = TrainersDir(tmp_path / "trainers"), FakeController()
    stranger = TrainerKey("job-9", 1, 3)
    for key in (GEN1, stranger, GEN2):
        append(log_file(trainers, key), f"{key.job_id} {key.generation}\n")
    controller.refused.add(stranger)
    ship = shipper(trainers, controller, {GEN2})
    rounds(ship, 3)
    assert controller.lines[GEN1] == ["job-1 1"] and controller.lines[GEN2] == ["job-1 2"]
    assert stranger in ship.finished and stranger not in controller.lines
    assert sum(1 for call in controller.calls for c in call if c.key == stranger) == 1, "refused once, then left"


def test_an_unreachable_controller_loses_nothing_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainers, controller = TrainersDir(tmp_path / "trainers"), FakeController()
    append(log_file(trainers, GEN1), "kept\n")
    controller.outages = 3
    with caplog.at_level(logging.INFO, logger="spotmorph.agent"):
        assert rounds(shipper(trainers, controller, set()), 6) == [0, 0, 0, 1, 1, 0]  # asks, sends, done
    assert controller.lines[GEN1] == ["kept"]
    said = [r.getMessage() for r in caplog.records]
    assert sum("trainer logs not sent" in m for m in said) == 1, said
    assert sum("reach the controller again" in m for m in said) == 1, said


def test_a_log_path_that_is_no_regular_file_is_never_read(tmp_path: Path) -> None:
    trainers, controller = TrainersDir(tmp_path / "trainers"), FakeController()
    os.mkfifo(log_file(trainers, GEN1))  # a reader would block on it forever
    append(log_file(trainers, GEN2), "fine\n")
    ship = shipper(trainers, controller, {GEN2})
    rounds(ship, 3)
    assert GEN1 in ship.finished and controller.lines[GEN2] == ["fine"]


def test_a_flush_before_the_node_goes_sends_everything_in_as_many_rounds_as_it_takes(tmp_path: Path) -> None:
    trainers, controller = TrainersDir(tmp_path / "trainers"), FakeController()
    lines = [f"last words {i} " + "z" * 100 for i in range(6000)]  # ~700 KiB: several calls
    ship = shipper(trainers, controller, set())
    rounds(ship, 1)  # the agent was running before its trainer wrote anything
    append(log_file(trainers, GEN1), "".join(f"{line}\n" for line in lines) + "no newline")
    asyncio.run(ship.flush())
    assert controller.lines[GEN1] == [*lines, "no newline"] and GEN1 in ship.finished
    assert len(controller.calls) == 3  # 256 KiB a call


def test_shares_are_even_and_what_small_files_leave_goes_to_the_others() -> None:
    assert shares([10, 1000, 1000], 300) == [10, 145, 145]
    assert shares([5, 5], 300) == [5, 5]
    assert sum(shares([10**6] * 7, MAX_CALL_BYTES)) <= MAX_CALL_BYTES


def test_logs_reach_a_real_controller_through_the_transport(tmp_path: Path) -> None:
    with running(tmp_path) as live:
        reply = live.agent(live.agent_token("vm-logs")).Register(pb.RegisterRequest(slots=2, address="127.0.0.1"))
        node = Registration(reply.node_name, reply.incarnation, reply.node_token, 1.0, 5.0)
        job = live.jobs().SubmitJob(pb.SubmitJobRequest(spec=spec(live))).id
        beat = pb.HeartbeatRequest(node_name=node.node_name, incarnation=node.incarnation)
        assignment = live.agent(node.node_token).Heartbeat(beat).assignment
        assert assignment.job == job
        trainers = TrainersDir(tmp_path / "work" / "trainers")
        ours = [TrainerKey(job, assignment.generation, r) for r in assignment.ranks]
        for key in ours:
            append(log_file(trainers, key), f"rank {key.rank} says hi\nTraceback (most recent call last):\n")
        append(log_file(trainers, TrainerKey(job, assignment.generation, 99)), "not ours\n")
        append(log_file(trainers, TrainerKey("job-404", 1, 0)), "no such job\n")

        async def ship_all() -> LogShipper:
            link = ControllerLink(Endpoint((live.address,)))
            ship = LogShipper(trainers, lambda chunks: link.report_logs(node, chunks), lambda: ())
            for _ in range(4):
                await ship.ship()
            await link.close()
            return ship

        ship = asyncio.run(ship_all())
        assert ship.pending() == set() and set(ours) <= ship.finished
        watched = live.jobs("reader").WatchLogs(pb.WatchLogsRequest(job=job), timeout=10)
        got = sorted((line.rank, line.node, line.text) for line in watched)
        assert got == sorted(
            (key.rank, node.node_name, text)
            for key in ours
            for text in (f"rank {key.rank} says hi", "Traceback (most recent call last):")
        )
