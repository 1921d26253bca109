"""How long a checkpoint paused training, decided by the pure core and shown by status and the timeline.

Each rank reports the stall of its newest checkpoint (its progress file's ``CheckpointWritten``); the job
shows the newest checkpoint's, as its slowest rank felt it (the next step's collectives wait for every rank).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace

from controller.client.commands.status import stall_line, watch_view
from controller.client.timeline import build, render_html
from controller.core.events import EventKind
from controller.core.model import RankReport
from controller.core.reconcile import assignment_for
from controller.persistence.codec import job_from_dict, job_to_dict
from tests.controller.helpers import from_old_row, version_9_row
from tests.controller.test_eval_and_pause import events, evict_one
from tests.controller.test_reconcile import Sim, started
from tests.controller.test_timeline import SVG


def beat(sim: Sim, step: int, stalls: dict[str, tuple[int, float] | None]) -> None:
    """Each named node reports its ranks at ``step`` with the stall (checkpoint step, seconds) it gives."""
    for name, stall in stalls.items():
        a = assignment_for(sim.world, name)
        assert a is not None
        ranks = [RankReport("j1", a.generation, r, True, None, step, 0) for r in a.ranks]
        if stall is not None:
            ranks = [replace(r, stall_step=stall[0], stall_seconds=stall[1]) for r in ranks]
        sim.beat(name, *ranks)


def shown(sim: Sim) -> tuple[int, int, float | None]:
    job = sim.job()
    return job.checkpoint_stall.generation, job.checkpoint_stall.step, job.checkpoint_stall.seconds


def measured(sim: Sim) -> list[tuple[int, int, float]]:
    found = events(sim, EventKind.CHECKPOINT_STALL_MEASURED)
    return [(e.data["generation"], e.data["step"], e.data["stall_seconds"]) for e in found]


def test_the_newest_checkpoint_shows_its_slowest_ranks_stall_and_is_logged_once_per_change() -> None:
    sim = started(2)
    first, second = sim.job().nodes
    sim.step(1)
    assert shown(sim) == (0, 0, None) and not measured(sim)  # no checkpoint yet: nothing shown
    beat(sim, 10, {first: (10, 0.25), second: None})  # the second node has not reported its checkpoint yet
    sim.step(1)
    assert shown(sim) == (1, 10, 0.25)
    beat(sim, 10, {first: (10, 0.25), second: (10, 0.75)})  # ... and it was slower: training waited for it
    sim.step(1)
    assert shown(sim) == (1, 10, 0.75)
    beat(sim, 11, {first: (10, 0.25), second: (10, 0.5)})  # a faster rank of the same checkpoint changes nothing
    sim.step(1)
    sim.step(1)  # nor does the same report again
    assert shown(sim) == (1, 10, 0.75)
    assert measured(sim) == [(1, 10, 0.25), (1, 10, 0.75)]
    beat(sim, 20, {first: (20, 0.0625), second: (10, 0.75)})  # a newer checkpoint replaces it, shorter or not
    sim.step(1)
    assert shown(sim) == (1, 20, 0.0625)
    beat(sim, 20, {first: (10, 9.0), second: (10, 9.0)})  # an older checkpoint never replaces a newer one
    sim.step(1)
    assert shown(sim) == (1, 20, 0.0625) and len(measured(sim)) == 3


def test_a_new_generations_first_checkpoint_replaces_the_old_ones_whatever_its_step() -> None:
    sim = started(4)
    beat(sim, 40, {name: (40, 1.5) for name in sim.job().nodes})
    sim.step(1)
    assert shown(sim) == (1, 40, 1.5)
    evict_one(sim, 41, last_at=141.0)
    sim.step(1)
    assert sim.job().generation == 2
    sim.step(1)
    assert shown(sim) == (1, 40, 1.5)  # generation 2 has reported nothing yet
    # Generation 2 writes the checkpoint of the step it resumed from (a copy into its own directory).
    beat(sim, 41, {name: (41, 0.125) for name in sim.job().nodes})
    sim.step(1)
    assert shown(sim) == (2, 41, 0.125)
    assert measured(sim)[-1] == (2, 41, 0.125)


def test_the_stall_survives_the_store_and_rows_written_before_it_load() -> None:
    sim = started(2)
    beat(sim, 10, {name: (10, 0.375) for name in sim.job().nodes})
    sim.step(1)
    row = job_to_dict(sim.job())
    assert job_from_dict(row) == sim.job()
    old = {k: v for k, v in version_9_row(sim.job()).items() if not k.startswith("checkpoint_stall_")}
    assert shown(Sim(replace(sim.world, jobs={"j1": from_old_row(old)}))) == (0, 0, None)


def test_status_and_its_watch_view_show_the_stall_in_milliseconds() -> None:
    job = {
        "id": "job-1", "name": "demo", "state": "RUNNING", "step": 150, "total_steps": 300, "generation": 2,
        "layout": None, "last_checkpoint_step": 140, "steps_lost": 0, "reason": "", "eval_loss": None,
        "eval_step": None, "checkpoint_stall_seconds": 0.0125, "checkpoint_stall_step": 140,
    }  # fmt: skip
    assert stall_line(job) == "checkpoint at step 140 paused training 12.5 ms"
    assert "checkpoint at step 140 paused training 12.5 ms" in watch_view(job, None, 0.0)
    quiet = {**job, "checkpoint_stall_seconds": None, "checkpoint_stall_step": None}
    assert "paused training" not in watch_view(quiet, None, 0.0)


def test_the_timeline_names_each_checkpoints_stall() -> None:
    def ev(at: float, kind: str, **data: object) -> dict[str, object]:
        return {"at": at, "kind": kind, "job": "job-1", "node": None, "data": data}

    log = [
        ev(0, "GenerationIssued", generation=1, layout="1x2 (P x D), m=4", resume_step=0, cause="admitted"),
        ev(4, "CheckpointStallMeasured", generation=1, step=10, stall_seconds=0.002),
        ev(5, "CheckpointStallMeasured", generation=1, step=10, stall_seconds=0.004),  # a slower rank, later
        ev(6, "CheckpointCommitted", generation=1, step=10),
        ev(9, "CheckpointCommitted", generation=1, step=20),  # committed before its stall was heard of
    ]
    timeline = build(log, "job-1", global_batch=8)
    assert timeline.stalls == {10: 0.004}
    page = render_html(timeline, "job-1")
    svg = ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])
    titles = [t.text or "" for t in svg.iter(f"{SVG}title")]
    assert "checkpoint at step 10, training paused 4.0 ms for it" in titles
    assert "checkpoint at step 20" in titles
