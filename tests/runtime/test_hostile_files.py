"""Files on the checkpoint share and in the control dir are hostile ground: a FIFO, a device, a link, a huge
file, JSON nested past the parser's recursion, NaN or a number of 400 digits each get a clear answer at once
(refused, or read as "no request" / "the lease ran out"), never a hang, a crash or a lease that never lapses.
Real files throughout: real FIFOs (``os.mkfifo``), a real device, real links."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker_agent.contract import (
    ControlDir,
    ExitCode,
    ProgressReader,
    ProgressRecord,
    SalvageOrder,
    StepCompleted,
    TrainerFailed,
    events_of,
    progress_line,
    read_progress,
)
from worker_agent.contract.hostile import HostileFile, parse_json_bounded, read_bounded, read_counter
from worker_agent.runtime.errors import FenceError
from worker_agent.runtime.link.control import CheckpointRequests, LeaseWatch, ProgressLog
from worker_agent.runtime.link.startup import Phase, StartupWatch
from worker_agent.runtime.storage.fence import FENCE, LOCK, Fence, check_fence, raise_fence, read_fence

DEEP = "[" * 100_000 + "]" * 100_000


def test_only_a_regular_file_within_its_bound_is_read_and_opening_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open() would never return
    with pytest.raises(HostileFile, match=r"fifo: is not a regular file \(a FIFO\)"):
        read_bounded(fifo, 100)
    with pytest.raises(HostileFile, match=r"a character device"):
        read_bounded("/dev/zero", 100)  # endless bytes
    with pytest.raises(HostileFile, match=r"a directory"):
        read_bounded(tmp_path, 100)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(HostileFile, match=r"big: 101 bytes, more than such a file may hold \(100\)"):
        read_bounded(tmp_path / "big", 100)
    (tmp_path / "link").symlink_to(tmp_path / "big")
    with pytest.raises(HostileFile, match=r"link: is a symbolic link"):
        read_bounded(tmp_path / "link", 1000)
    assert read_bounded(tmp_path / "link", 1000, follow_symlinks=True) == b"x" * 101
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "none", 100)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (DEEP, "nests deeper than 32 levels"),
        ('{"a": NaN}', "NaN is not a finite number"),
        ('{"a": -Infinity}', "-Infinity is not a finite number"),
        ('{"a": 1e999}', "out of range"),
        ('{"a": ' + "9" * 400 + "}", "does not fit 64 bits"),
        ('{"a": ', "is not valid JSON"),
    ],
)
def test_json_nested_too_deep_or_with_numbers_out_of_range_is_refused(text: str, why: str) -> None:
    with pytest.raises(HostileFile, match=f"^the file .*{why}"):
        parse_json_bounded(text, "the file")


def test_brackets_inside_strings_are_no_nesting_and_ordinary_numbers_pass() -> None:
    text = json.dumps({"a": "[" * 100, "b": ['x\\"]', {"c": -(2**63)}], "d": 1.5e-300})
    assert parse_json_bounded(text, "f") == {"a": "[" * 100, "b": ['x\\"]', {"c": -(2**63)}], "d": 1.5e-300}


def test_a_fifo_in_place_of_the_fence_refuses_the_generation_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / FENCE)
    with pytest.raises(FenceError, match=r"the fence is damaged \(.*\.fence: is not a regular file \(a FIFO\)"):
        raise_fence(tmp_path, Fence("job-1", 2))
    with pytest.raises(FenceError, match="a FIFO"):
        check_fence(tmp_path, Fence("job-1", 2))


def test_a_fifo_in_place_of_the_fences_lock_refuses_the_generation_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LOCK)
    with pytest.raises(FenceError, match=r"the fence's lock .*\.fence\.lock is not a regular file; remove it"):
        raise_fence(tmp_path, Fence("job-1", 2))
    (tmp_path / LOCK).unlink()
    assert raise_fence(tmp_path, Fence("job-1", 2)) == read_fence(tmp_path)


def test_a_deeply_nested_or_huge_fence_is_a_damaged_fence_not_a_recursion_error(tmp_path: Path) -> None:
    (tmp_path / FENCE).write_text("[" * 2000 + "]" * 2000)  # within the fence's 4 KiB, past the recursion limit
    with pytest.raises(FenceError, match="nests deeper than 32 levels"):
        read_fence(tmp_path)
    (tmp_path / FENCE).write_text(json.dumps({"job": "j" * 5000, "generation": 1}))
    with pytest.raises(FenceError, match="more than such a file may hold"):
        read_fence(tmp_path)


def _lease(control: ControlDir, text: str) -> None:
    control.path.mkdir(parents=True, exist_ok=True)
    control.lease_file.write_text(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"renewed": NaN, "valid_for": 30}',
        '{"renewed": 1, "valid_for": Infinity}',
        '{"renewed": 1, "valid_for": 1e999}',
        '{"renewed": 1, "valid_for": ' + "9" * 400 + "}",
    ],
)
def test_a_lease_that_is_not_finite_has_run_out(tmp_path: Path, text: str) -> None:
    control = ControlDir(tmp_path / "control")
    _lease(control, text)
    assert LeaseWatch(control).lapsed()


def test_a_fifo_in_place_of_the_lease_has_run_out_at_once(tmp_path: Path) -> None:
    control = ControlDir(tmp_path)
    os.mkfifo(control.lease_file)
    assert LeaseWatch(control).lapsed()


def test_a_checkpoint_request_of_400_digits_or_a_fifo_is_no_request(tmp_path: Path) -> None:
    control = ControlDir(tmp_path)
    control.path.mkdir(exist_ok=True)
    control.checkpoint_request_file.write_text("9" * 400)
    assert CheckpointRequests(control, 0).contribution() == 0.0  # was float(int('9' * 400)): OverflowError
    control.acknowledged_file.write_text("9" * 400)
    assert control.acknowledged_checkpoint() == 0
    control.checkpoint_request_file.unlink()
    os.mkfifo(control.checkpoint_request_file)
    assert control.checkpoint_request() == 0
    control.request_checkpoint(7)
    assert CheckpointRequests(control, 0).contribution() == 7.0
    (tmp_path / "minus").write_text("-1")
    with pytest.raises(HostileFile, match=r"holds '-1', not a counter"):
        read_counter(tmp_path / "minus")


@pytest.mark.parametrize("deadline", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_salvage_order_whose_deadline_is_no_finite_time_is_refused(deadline: str) -> None:
    with pytest.raises(ValueError, match="salvage order"):
        SalvageOrder.from_json('{"step": 3, "writers": [0], "deadline": ' + deadline + "}")


def test_a_deeply_nested_or_fifo_salvage_order_is_no_order(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nests deeper"):
        SalvageOrder.from_json(DEEP)
    control = ControlDir(tmp_path)
    os.mkfifo(control.salvage_file)
    assert control.salvage_request() is None
    control.salvage_file.unlink()
    control.request_salvage(SalvageOrder(3, (0, 2), 1e9).to_json())
    assert SalvageOrder.from_json(control.salvage_request() or "") == SalvageOrder(3, (0, 2), 1e9)


def test_a_progress_file_replaced_by_a_fifo_reads_as_no_records_and_a_nested_line_is_skipped(tmp_path: Path) -> None:
    """The agent reads what the user's code can write: a FIFO there must not block it, a line nested past the
    parser's recursion must not crash it; a diverged loss (NaN) is still reported."""
    path = tmp_path / "progress-rank-0.jsonl"
    os.mkfifo(path)
    assert ProgressReader(path).poll() == []
    path.unlink()
    diverged = ProgressRecord(StepCompleted(3, math.nan, 1.0, 2.0, None), 0, 1, 123, 5.0)
    path.write_text("[" * 5000 + "\n" + progress_line(diverged) + "\n")
    (record,) = read_progress(path)
    assert isinstance(record.event, StepCompleted) and math.isnan(record.event.loss)


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_fence_lock_held_by_another_host_ends_the_start_up_with_an_event_naming_the_phase(tmp_path: Path) -> None:
    """A real process holds the fence's lock (a frozen trainer of an older generation); the watchdog's time is
    up at once (injected), and its exit releases the holder so that this test goes on."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / LOCK)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    exits: list[int] = []

    def exit(code: int) -> None:
        exits.append(code)
        holder.kill()  # only now can this process's lockf return
        holder.wait()

    progress_file = tmp_path / "progress-rank-0.jsonl"
    watch = StartupWatch(ProgressLog(progress_file, 0, 2), 0, wait=lambda done, limit: False, exit=exit)
    with watch.phase(Phase.FENCE, 60.0):
        raise_fence(tmp_path, Fence("job-1", 2))
    assert exits == [ExitCode.ABORTED]
    (failed,) = events_of(read_progress(progress_file), TrainerFailed)
    assert failed.kind == "abort"
    assert failed.message.startswith("start-up phase fence (raising the checkpoint dir's fence (waiting for its lock")
    assert "did not finish in 60 s" in failed.message


def test_a_phase_that_finishes_in_time_ends_nothing(tmp_path: Path) -> None:
    exits: list[int] = []
    watch = StartupWatch(ProgressLog(None, 0, 1), 0, exit=exits.append)
    with watch.phase(Phase.FENCE, 60.0):
        raise_fence(tmp_path, Fence("job-1", 1))
    assert exits == [] and read_fence(tmp_path) == Fence("job-1", 1)
