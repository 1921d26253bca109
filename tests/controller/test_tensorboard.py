"""TensorBoard export: what a job record change writes (pure), and the files TensorBoard's own reader gets back.

The end-to-end run (a real cluster through an eviction, every loss point equal to the trainers' own) is
tests/e2e/test_eval_and_pause.py.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from controller.core.lifecycle import JobState
from controller.core.model import JobRecord
from controller.core.records import CheckpointRef, Evaluation, Training
from controller.observability.tensorboard import Point, Seen, TensorBoardExport, points, seen
from controller.observability.tfevents import EventFile, crc32c, scalar_event
from morphing.layout import make_layout
from tests.controller.helpers import job

LAYOUT = make_layout(num_layers=6, pipeline_stages=2, data_parallel=2, micro_batch_size=2, global_batch=8)


def running(step: int = 0, loss: float | None = None, generation: int = 1, **fields: Any) -> JobRecord:
    record = job("job-1", JobState.RUNNING, generation=generation, layout=LAYOUT, **fields)
    return replace(record, training=Training(loss, step, 12.5 if loss is not None else None))


class FakeView:
    def __init__(self, *jobs: JobRecord) -> None:
        self.records = jobs
        self.change = asyncio.Event()

    def jobs(self) -> tuple[JobRecord, ...]:
        return self.records

    def next_change(self) -> asyncio.Event:
        return self.change


def read(folder: Path) -> EventAccumulator:
    board = EventAccumulator(str(folder))
    board.Reload()
    return board


def test_the_checksum_is_crc32c() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    assert crc32c(b"") == 0


def test_a_new_generation_writes_its_layout_and_a_marker_and_a_new_step_its_loss() -> None:
    first = points(None, running(step=10, loss=2.5, reason="generation 1: 2x2 (P x D), m=2 (admitted)"))
    assert Point("train/loss", 10, 2.5) in first and Point("train/samples_per_second", 10, 12.5) in first
    assert Point("layout/gpus", 0, 4) in first and Point("layout/stages", 0, 2) in first  # where it starts
    assert Point("layout/gpus", 10, 4) in first and Point("layout/micro_batch_size", 10, 2) in first
    assert Point("morphs", 0, text="generation 1 from step 0: generation 1: 2x2 (P x D), m=2 (admitted)") in first
    assert points(Seen(10, 0, 1), running(step=10, loss=2.5)) == []  # nothing new: nothing written
    assert points(Seen(10, 0, 1), running(step=11, loss=2.4)) == [
        Point("train/loss", 11, 2.4),
        Point("train/samples_per_second", 11, 12.5),
        Point("layout/stages", 11, 2),
        Point("layout/replicas", 11, 2),
        Point("layout/gpus", 11, 4),
        Point("layout/micro_batch_size", 11, 2),
    ]
    evaluated = points(Seen(11, 0, 1), running(step=11, loss=2.4, evaluation=Evaluation(11, 2.9)))
    assert evaluated == [Point("eval/loss", 11, 2.9)]


@settings(max_examples=50, deadline=None)
@given(steps=st.lists(st.integers(0, 300), min_size=1, max_size=30))
def test_no_step_is_written_twice_whatever_order_the_reports_come_in(
    steps: list[int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("tb")
    view = FakeView()
    export = TensorBoardExport(folder, view, lambda: 1000.0)
    for step in steps:  # a generation that resumed from an earlier step reports smaller steps again
        export.export([running(step=step, loss=float(step))])
    export.close()
    board = read(folder / "job-1")
    written = [e.step for e in board.Scalars("train/loss")] if "train/loss" in board.Tags()["scalars"] else []
    assert written == sorted(set(written)) and set(written) <= set(steps)
    assert written == sorted({s for i, s in enumerate(steps) if s > 0 and s > max(steps[:i], default=0)})


def test_files_read_back_with_tensorboard_and_a_restart_repeats_nothing(tmp_path: Path) -> None:
    job_at = running(step=20, loss=1.75, reason="generation 1: 2x2")
    view = FakeView(running(step=10, loss=2.0))
    export = TensorBoardExport(tmp_path, view, lambda: 1000.0)
    assert export.export(view.jobs()) == 0  # what was there at start is not exported: from now on
    assert export.export([job_at]) == 6  # its loss, its rate and the layout that ran it
    export.export([replace(running(step=20, loss=1.75, generation=2, resume=CheckpointRef(20, 1)), reason="grow")])
    export.close()
    again = TensorBoardExport(tmp_path, FakeView(job_at), lambda: 2000.0)  # a restarted controller
    again.export([job_at])
    again.export([running(step=21, loss=1.5)])
    again.close()
    board = read(tmp_path / "job-1")
    assert [(e.step, e.value) for e in board.Scalars("train/loss")] == [(20, 1.75), (21, 1.5)]
    assert [(e.step, e.value) for e in board.Scalars("layout/gpus")] == [(20, 4.0), (21, 4.0)]
    [marker] = board.Tensors("morphs")
    assert (marker.step, marker.tensor_proto.string_val) == (20, [b"generation 2 from step 20: grow"])
    assert len(list((tmp_path / "job-1").iterdir())) == 2  # one file per controller run


def test_the_export_runs_after_every_commit_until_cancelled(tmp_path: Path) -> None:
    async def scenario() -> None:
        view = FakeView()
        export = TensorBoardExport(tmp_path, view, lambda: 1000.0)
        task = asyncio.ensure_future(export.run())
        await asyncio.sleep(0)
        view.records = (running(step=5, loss=3.0),)
        changed, view.change = view.change, asyncio.Event()
        changed.set()
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        export.close()

    asyncio.run(scenario())
    assert [(e.step, e.value) for e in read(tmp_path / "job-1").Scalars("train/loss")] == [(5, 3.0)]


def test_a_torn_last_record_is_skipped_by_the_reader_and_the_rest_still_read(tmp_path: Path) -> None:
    file = EventFile(tmp_path, 1000.0)
    file.scalar("train/loss", 2.0, 1, 1000.0)
    file.close()
    with file.path.open("ab") as torn:  # a controller killed mid-write
        torn.write(struct.pack("<Q", 999) + b"\x00\x01")
    assert [(e.step, e.value) for e in read(tmp_path).Scalars("train/loss")] == [(1, 2.0)]
    assert scalar_event("t", 1.0, 1, 0.0) != scalar_event("t", 1.0, 2, 0.0)


def test_seen_takes_no_step_from_a_job_without_a_loss() -> None:
    assert seen(running(step=7)) == Seen(0, 0, 1, (2, 2, 4, 2))


def test_an_ended_jobs_file_is_closed_and_at_most_max_open_stay_open(tmp_path: Path) -> None:
    """Issue 44: one file per job stayed open for the controller's life, until SubmitJob ran out of descriptors."""
    export = TensorBoardExport(tmp_path, FakeView(), lambda: 1000.0, max_open=2)
    opened: list[Any] = []
    records = [replace(running(step=5, loss=1.0), id=f"job-{i}") for i in range(5)]
    for record in records:
        export.export([record])
        opened.append(export.files[record.id])
    assert list(export.files) == ["job-3", "job-4"]  # the least recently written closed
    assert [f._file.closed for f in opened] == [True, True, True, False, False]
    export.export([replace(records[0], training=Training(0.5, 6, 12.5))])  # written again: opened again
    assert list(export.files) == ["job-4", "job-0"] and opened[3]._file.closed
    ended = replace(records[4], state=JobState.SUCCEEDED, training=Training(0.25, 7, 12.5))
    export.export([ended])
    assert list(export.files) == ["job-0"] and opened[4]._file.closed  # its last point, then closed
    reopened = export.files["job-0"]
    export.close()
    assert export.files == {} and reopened._file.closed
    board = read(tmp_path / "job-4")
    assert [(e.step, e.value) for e in board.Scalars("train/loss")] == [(5, 1.0), (7, 0.25)]
    assert [(e.step, e.value) for e in read(tmp_path / "job-0").Scalars("train/loss")] == [(5, 1.0), (6, 0.5)]


def test_the_layout_is_written_at_every_logged_step_and_jumps_only_at_morphs(tmp_path: Path) -> None:
    """Issue 45: written only at each morph, TensorBoard drew diagonals from one layout to the next."""
    narrow = make_layout(num_layers=6, pipeline_stages=1, data_parallel=2, micro_batch_size=2, global_batch=8)
    deep = make_layout(num_layers=6, pipeline_stages=3, data_parallel=1, micro_batch_size=4, global_batch=8)
    export = TensorBoardExport(tmp_path, FakeView(), lambda: 1000.0)

    def at(step: int, generation: int, layout: Any, by: int | None = None, **fields: Any) -> JobRecord:
        record = job("job-1", JobState.RUNNING, generation=generation, layout=layout, **fields)
        return replace(record, training=Training(3.0 - step / 100, step, 50.0, generation=by or generation))

    for step in range(1, 31):
        export.export([at(step, 1, LAYOUT)])
    export.export([at(30, 2, narrow, by=1, held=CheckpointRef(30, 1), reason="eviction")])  # issued; no new step yet
    for step in range(31, 60):
        export.export([at(step, 2, narrow, held=CheckpointRef(30, 1))])
    # Generation 2's last step is heard in the same commit that issues 3, from its checkpoint at step 50.
    export.export([at(60, 3, deep, by=2, resume=CheckpointRef(50, 2), reason="grow")])
    for step in range(51, 81):  # it redoes 51..60: those steps are written once, by generation 2
        export.export([at(step, 3, deep, resume=CheckpointRef(50, 2))])
    export.close()
    board = read(tmp_path / "job-1")
    logged = [e.step for e in board.Scalars("train/loss")]
    assert logged == list(range(1, 81))
    for tag, values in (
        ("layout/gpus", (4, 2, 3)),
        ("layout/stages", (2, 1, 3)),
        ("layout/micro_batch_size", (2, 2, 4)),
    ):
        written = {e.step: e.value for e in board.Scalars(tag)}
        assert [e.step for e in board.Scalars(tag)] == [0, *logged]  # from where generation 1 started, in order
        assert all(written[s] == values[0] for s in range(0, 31)), tag
        assert all(written[s] == values[1] for s in range(31, 61)), tag
        assert all(written[s] == values[2] for s in range(61, 81)), tag
    gpus = [e.value for e in board.Scalars("layout/gpus")]
    assert sum(a != b for a, b in itertools.pairwise(gpus)) == 2  # a step function: it jumps at the two morphs only
    assert [m.step for m in board.Tensors("morphs")] == [0, 30, 50]
