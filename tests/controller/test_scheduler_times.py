"""The times the scheduler's aging and starvation count: how long a job has waited with no GPUs, and how long it
has had some, kept across what ``state_since`` resets at (a queued job's new reason, each morph); persisted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Unpack

from sqlalchemy import create_engine, text

from controller.core.causes import MorphCause
from controller.core.changes import move
from controller.core.lifecycle import JobState
from controller.core.model import Action, AddJob, SetJob, World
from controller.core.reconcile import Config
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.views import view
from controller.core.records import JobRecord, Morph, MoveFields
from controller.persistence.codec import job_to_dict
from controller.persistence.store import MIGRATIONS, Store, database_url, migrate
from tests.controller.helpers import job, planner

LAYOUT = planner().plan([("n1", 1)]).layout  # type: ignore[union-attr]


def moved(record: JobRecord, target: JobState, now: float, **fields: Unpack[MoveFields]) -> JobRecord:
    return move(record, target, str(target), now, **fields).job


def lifetime() -> list[JobRecord]:
    """Queued at 0, a new reason at 50, admitted at 100, a morph at 200 (its next generation at 210), back to the
    queue at 300, a new reason at 350, admitted again at 400."""
    queued = replace(job("j1"), queued_since=0.0)
    waits = moved(queued, JobState.QUEUED, 50.0)
    running = moved(waits, JobState.RUNNING, 100.0, generation=1, layout=LAYOUT)
    morphing = moved(running, JobState.MORPHING, 200.0, action=Action.STOP, morph=Morph(cause=MorphCause.GROW))
    again = moved(morphing, JobState.RUNNING, 210.0, generation=2, layout=LAYOUT)
    back = moved(moved(again, JobState.MORPHING, 290.0, action=Action.ABORT, morph=Morph(cause=MorphCause.NODE_LOST)),
                 JobState.QUEUED, 300.0)  # fmt: skip
    still = moved(back, JobState.QUEUED, 350.0)
    return [
        waits,
        running,
        morphing,
        again,
        back,
        still,
        moved(still, JobState.RUNNING, 400.0, generation=3, layout=LAYOUT),
    ]


def test_a_wait_and_a_run_each_count_from_when_they_began_not_from_the_last_state_change() -> None:
    waits, running, morphing, again, back, still, readmitted = lifetime()
    assert waits.queued_since == 0.0 and waits.state_since == 50.0
    assert running.running_since == morphing.running_since == again.running_since == 100.0
    assert back.queued_since == still.queued_since == 300.0 and still.state_since == 350.0
    assert readmitted.running_since == 400.0


def test_the_scheduler_sees_the_whole_wait_and_the_whole_run() -> None:
    waits, _, _, again, _, still, _ = lifetime()
    for record, waited, ran in ((waits, 90.0, 0.0), (again, 0.0, 490.0), (still, 290.0, 0.0)):
        now = 90.0 if record is waits else 590.0
        seen = view(Draft(World({}, {"j1": record}), now), Config(), {"j1": planner()}, record)
        assert seen is not None and (seen.waited_seconds, seen.running_seconds) == (waited, ran)


def test_both_stores_keep_the_times(store_target: Path | str) -> None:
    store = Store(store_target)
    kept = lifetime()[3]
    store.persist([AddJob(lifetime()[0], 1)])
    store.persist([SetJob(kept)])
    store.close()
    reopened = Store(store_target)
    assert reopened.load()[1]["j1"] == kept
    reopened.close()


def test_schema_20_gives_a_version_19_job_row_no_times_so_it_counts_from_its_state(tmp_path: Path) -> None:
    record = lifetime()[3]
    row = {k: v for k, v in job_to_dict(record).items() if k not in ("queued_since", "running_since")}
    path = tmp_path / "v19.db"
    engine = create_engine(database_url(path))
    migrate(engine, MIGRATIONS[:19])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs VALUES ('j1', 'RUNNING', 1, :data)"), {"data": json.dumps(row)})
    engine.dispose()
    assert Store(path).load()[1]["j1"] == replace(record, queued_since=None, running_since=None)
