"""The agent–trainer contract: what one side writes, the other reads back as the same value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker_agent.contract import (
    CheckpointLoaded,
    CheckpointWritten,
    CommittedCheckpoint,
    ControlDir,
    ExitCode,
    ProgressLineError,
    ProgressReader,
    ProgressRecord,
    StepCompleted,
    TrainerArguments,
    TrainerFailed,
    TrainersDir,
    TrainerStarted,
    TrainingFinished,
    TrainingStopped,
    WarmArguments,
    WarmAssignment,
    parse_progress_line,
    progress_line,
    read_progress,
)

segments = st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)
paths = st.lists(segments, min_size=1, max_size=4).map(lambda parts: Path("/", *parts))
optional_paths = st.none() | paths
hosts = st.sampled_from(["127.0.0.1", "node-3.internal", "10.0.0.7", "::1"])
rendezvous = st.builds(lambda h, p: f"{h}:{p}", hosts, st.integers(0, 65535))
counts = st.integers(0, 2**40)

job_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
committed = st.none() | st.builds(CommittedCheckpoint, counts, counts)
# A standalone run may name a checkpoint to load; a controller generation loads only the committed one.
origins = st.one_of(
    st.fixed_dictionaries({"load_from": optional_paths}),
    st.fixed_dictionaries({"fence_job": job_ids, "resume": committed}),
)
arguments = origins.flatmap(
    lambda origin: st.builds(
        TrainerArguments,
        job_file=paths,
        layout_file=paths,
        rank=st.integers(0, 4096),
        rendezvous=rendezvous,
        checkpoint_dir=paths,
        generation=counts,
        control_dir=optional_paths,
        progress_file=optional_paths,
        host_store=st.booleans(),
        device_index=st.none() | st.integers(0, 4096),
        **{key: st.just(value) for key, value in origin.items()},
    )
)

finite = st.floats(allow_nan=False)
steps = st.integers(0, 10**9)
last_checkpoint = st.none() | steps
events = st.one_of(
    st.builds(TrainerStarted, st.text(), st.none() | finite, finite, st.booleans()),
    st.builds(CheckpointLoaded, steps, st.text()),
    st.builds(StepCompleted, steps, finite, finite, finite, last_checkpoint),
    st.builds(CheckpointWritten, steps, last_checkpoint),
    st.builds(TrainingStopped, steps, last_checkpoint, finite, finite),
    st.builds(TrainingFinished, steps, last_checkpoint, finite, finite),
    st.builds(
        TrainerFailed, st.sampled_from(["input", "node", "checkpoint", "abort", "lease_expired", "fenced"]), st.text()
    ),
)
records = st.builds(ProgressRecord, events, st.integers(0, 4096), counts, st.integers(1, 2**22), finite)


@given(arguments)
def test_trainer_arguments_round_trip_through_argv(value: TrainerArguments) -> None:
    assert TrainerArguments.from_argv(value.to_argv()) == value


@given(arguments, paths)
def test_a_warm_assignment_round_trips_through_its_file(value: TrainerArguments, log: Path) -> None:
    assignment = WarmAssignment(value, log)
    assert WarmAssignment.from_json(assignment.to_json()) == assignment


@given(records)
def test_progress_records_round_trip_through_a_line(record: ProgressRecord) -> None:
    line = progress_line(record)
    assert "\n" not in line
    assert parse_progress_line(line) == record


def test_lines_written_before_the_contract_still_parse() -> None:
    """The on-disk names (``step``, ``stopped``, ...) and fields are those the trainers always wrote."""
    old = [
        '{"event": "started", "rank": 1, "generation": 2, "pid": 9, "time": 5.0, "layout": "2x1",'
        ' "process_started_at": null, "ready_at": 4.0, "warm": false}',
        '{"event": "resumed", "rank": 1, "generation": 2, "pid": 9, "time": 5.5, "step": 40, "checkpoint": "/c"}',
        '{"event": "step", "rank": 1, "generation": 2, "pid": 9, "time": 6.0, "step": 41, "loss": 0.5,'
        ' "step_seconds": 0.1, "samples_per_second": 160.0, "last_checkpoint": null}',
        '{"event": "stopped", "rank": 1, "generation": 2, "pid": 9, "time": 7.0, "step": 42,'
        ' "last_checkpoint": 42, "stop_at": 6.9, "checkpoint_seconds": 0.05}',
        '{"event": "error", "rank": 1, "generation": 2, "pid": 9, "time": 8.0, "kind": "abort", "message": "x"}',
    ]
    parsed = [parse_progress_line(line) for line in old]
    assert [type(r.event) for r in parsed] == [
        TrainerStarted,
        CheckpointLoaded,
        StepCompleted,
        TrainingStopped,
        TrainerFailed,
    ]
    assert parsed[2].event == StepCompleted(41, 0.5, 0.1, 160.0, None)
    for line, record in zip(old, parsed, strict=True):
        assert json.loads(progress_line(record)) == json.loads(line)


@pytest.mark.parametrize(
    "line",
    ["", "{", "[1]", '{"event": "teleported", "rank": 0}', '{"event": "step", "rank": 0, "generation": 1}'],
)
def test_what_is_not_a_record_is_refused(line: str) -> None:
    with pytest.raises(ProgressLineError):
        parse_progress_line(line)


def test_the_reader_returns_complete_lines_once(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    reader = ProgressReader(path)
    assert reader.poll() == []
    first = ProgressRecord(CheckpointWritten(3, 3), 0, 1, 7, 1.0)
    second = ProgressRecord(TrainingFinished(3, 3, 1.5, 0.2), 0, 1, 7, 2.0)
    line = progress_line(second)
    path.write_text(progress_line(first) + "\n" + line[:10])
    assert reader.poll() == [first]
    with open(path, "a") as handle:
        handle.write(line[10:] + "\nnot json\n")
    assert reader.poll() == [second]
    assert reader.poll() == []
    assert read_progress(path) == [first, second]


def test_the_work_dir_layout_is_the_one_on_disk(tmp_path: Path) -> None:
    trainers = TrainersDir(tmp_path)
    directory = trainers.generation_dir("job-1", 3)
    assert directory.path == tmp_path / "job-1" / "gen-3"
    assert (directory.job, directory.generation) == ("job-1", 3)
    assert directory.pid_file(2) == directory.path / "rank-2.pid"
    assert directory.progress_file(2) == directory.path / "progress-rank-2.jsonl"
    assert directory.log_file(2) == directory.path / "rank-2.log"
    assert directory.control.stop_file == directory.path / "control" / "stop"
    assert trainers.warm_spool("w-1").assignment_file == tmp_path / ".warm" / "w-1" / "assignment.json"
    for rank in (0, 1, 10):
        directory.path.mkdir(parents=True, exist_ok=True)
        directory.pid_file(rank).write_text("1")
        directory.progress_file(rank).write_text("")
    other = trainers.generation_dir("job-2", 1)
    other.path.mkdir(parents=True)
    other.pid_file(0).write_text("2")
    assert list(directory.pid_files()) == list(directory.progress_files()) == [0, 1, 10]
    assert trainers.generation_dirs() == [directory, other]
    assert trainers.generation_dirs("job-2") == [other]
    assert sorted(trainers.pid_files()) == sorted([*directory.pid_files().values(), other.pid_file(0)])


def test_the_control_dir_carries_stop_and_checkpoint_requests(tmp_path: Path) -> None:
    control = ControlDir(tmp_path / "control")
    assert not control.stop_requested() and control.checkpoint_request() == 0
    control.request_checkpoint(3)
    control.request_checkpoint(4)
    assert control.checkpoint_request() == 4
    assert [p.name for p in control.path.iterdir()] == ["checkpoint-request"]
    control.request_stop()
    assert control.stop_requested()
    control.clear_stop()
    assert not control.stop_requested()


def test_trainer_arguments_point_into_their_generation_dir(tmp_path: Path) -> None:
    directory = TrainersDir(tmp_path).generation_dir("job-1", 4)
    made = TrainerArguments.in_generation_dir(directory, 1, "10.0.0.1:29501", tmp_path / "ckpt", host_store=True)
    assert made.generation == 4 and made.progress_file == directory.progress_file(1)
    assert made.control_dir == directory.control.path and made.job_file == directory.job_file
    assert (made.rendezvous_host, made.rendezvous_port) == ("10.0.0.1", 29501)
    assert made.command("py")[:3] == ["py", "-m", "worker_agent.runtime.process.trainer"]


@pytest.mark.parametrize("endpoint", ["no-port", "host:", "host:port", "host:²"])
def test_a_bad_rendezvous_is_refused_like_any_bad_flag(endpoint: str, tmp_path: Path) -> None:
    argv = TrainerArguments(tmp_path, tmp_path, 0, "h:1", tmp_path).to_argv()
    argv = [a if not a.startswith("--rendezvous=") else f"--rendezvous={endpoint}" for a in argv]
    with pytest.raises(SystemExit) as info:
        TrainerArguments.from_argv(argv)
    assert info.value.code == ExitCode.USER_ERROR


def test_the_device_index_is_a_flag_of_its_own_and_never_negative(tmp_path: Path) -> None:
    made = TrainerArguments(tmp_path, tmp_path, 0, "h:1", tmp_path, device_index=3)
    assert "--device-index=3" in made.to_argv()
    assert TrainerArguments(tmp_path, tmp_path, 0, "h:1", tmp_path).device_index is None
    with pytest.raises(SystemExit) as info:
        TrainerArguments.from_argv([*made.to_argv()[:-1], "--device-index=-1"])
    assert info.value.code == ExitCode.USER_ERROR


def test_a_committed_checkpoint_belongs_to_a_fenced_controller_generation(tmp_path: Path) -> None:
    base = TrainerArguments(tmp_path, tmp_path, 0, "h:1", tmp_path, generation=4).to_argv()
    fenced = TrainerArguments.from_argv([*base, "--fence-job=job-3", "--resume=200:3"])
    assert (fenced.fence_job, fenced.resume) == ("job-3", CommittedCheckpoint(200, 3))
    for wrong in (
        ["--resume=200:3"],
        ["--fence-job=job-3", f"--load-from={tmp_path}"],
        ["--fence-job=j", "--resume=7"],
    ):
        with pytest.raises(SystemExit) as info:
            TrainerArguments.from_argv([*base, *wrong])
        assert info.value.code == ExitCode.USER_ERROR


def test_warm_arguments_round_trip(tmp_path: Path) -> None:
    made = WarmArguments(tmp_path / "spool", 1234)
    assert WarmArguments.from_argv(made.command("py")[3:]) == made


def test_exit_codes_are_the_documented_statuses() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "SUCCEEDED": 0,
        "ABORTED": 1,
        "USER_ERROR": 2,
        "CHECKPOINT_NOT_WRITTEN": 3,
        "LEASE_EXPIRED": 4,
        "FENCED": 5,
        "NOT_STARTED": 127,
    }
