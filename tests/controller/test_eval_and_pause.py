"""Evaluation losses and the pause a morph causes, decided by the pure core with a fake clock, and drawn.

The pause runs from the last step the job completed before a morph to the first step the new generation
completed, on the trainers' own clocks; the decision time is the controller's (``now``). Both travel
into the job record, the generations table (through :class:`RecordPause`) and the event log.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

from controller.client.timeline import Pause, build, render_html
from controller.client.timeline_png import render_png
from controller.core.commands import RecordPause
from controller.core.events import EventKind
from controller.core.lifecycle import JobState
from controller.core.model import RankReport, RecordEvent, StartGeneration
from controller.core.reconcile import assignment_for
from controller.core.records import CheckpointRef
from morphing.transfer import HeldSkipCause
from tests.controller.test_reconcile import Sim, started
from tests.controller.test_timeline import SVG

J = JobState


def beat_all(
    sim: Sim, step: int, *, first_at: float | None = None, last_at: float | None = None, **fields: object
) -> None:
    """Every node of j1 reports its ranks of the current generation, with step times and an evaluation."""
    job = sim.job()
    for name in job.nodes:
        a = assignment_for(sim.world, name)
        assert a is not None
        ranks = [
            RankReport("j1", a.generation, r, True, None, step, 0, first_step_at=first_at, last_step_at=last_at)
            for r in a.ranks
        ]
        sim.beat(name, *(replace(r, **fields) for r in ranks))  # type: ignore[arg-type]


def events(sim: Sim, kind: EventKind) -> list[RecordEvent]:
    return [c for c in sim.log if isinstance(c, RecordEvent) and c.kind is kind]


def test_the_newest_evaluation_reaches_the_job_once_and_the_event_log() -> None:
    sim = started(2)
    beat_all(sim, 10, eval_step=10, eval_loss=2.5)
    sim.step(1)
    assert (sim.job().evaluation.step, sim.job().evaluation.loss) == (10, 2.5)
    sim.step(1)  # the same report again: no second event
    assert [(e.data["step"], e.data["loss"]) for e in events(sim, EventKind.EVALUATION_COMPLETED)] == [(10, 2.5)]
    beat_all(sim, 25, eval_step=20, eval_loss=2.25)
    sim.step(1)
    assert (sim.job().evaluation.step, sim.job().evaluation.loss) == (20, 2.25)
    beat_all(sim, 26, eval_step=10, eval_loss=9.0)  # an older evaluation never replaces a newer one
    sim.step(1)
    assert (sim.job().evaluation.step, sim.job().evaluation.loss) == (20, 2.25)
    assert len(events(sim, EventKind.EVALUATION_COMPLETED)) == 2


def evict_one(sim: Sim, step: int, last_at: float) -> None:
    """An eviction notice; every rank stops at ``step`` (completed at ``last_at``) and exits 0."""
    victim = sim.job().nodes[-1]
    sim.beat(victim, *sim.world.observed[victim].ranks, notice=sim.now + 30)
    sim.step(1)
    assert sim.job().state is J.MORPHING
    for name in sim.job().nodes:
        a = assignment_for(sim.world, name)
        assert a is not None
        ranks = [RankReport("j1", a.generation, r, False, 0, step, step, last_step_at=last_at) for r in a.ranks]
        sim.beat(name, *ranks, notice=sim.now + 30 if name == victim else None)


def test_the_pause_runs_from_the_last_step_before_a_morph_to_the_first_after_it() -> None:
    sim = started(4)
    beat_all(sim, 40, first_at=100.0, last_at=140.0)
    sim.step(1)
    assert sim.job().last_step_at == 140.0 and sim.job().morph.paused_since is None  # generation 1: nothing paused
    evict_one(sim, 41, last_at=141.5)
    morph_started = sim.job().morph.started_at
    sim.step(2)  # the controller decides 2 s after the notice came
    job = sim.job()
    assert job.state is J.RUNNING and job.generation == 2
    assert job.morph.paused_since == 141.5
    assert morph_started is not None and job.morph.decision_seconds == sim.now - morph_started
    sim.step(5)  # generation 2 starts: no step yet, nothing measured
    assert not [c for c in sim.log if isinstance(c, RecordPause)]
    beat_all(sim, 42, first_at=148.0, last_at=148.0)
    sim.step(1)
    assert [c for c in sim.log if isinstance(c, RecordPause)] == [RecordPause("j1", 2, 6.5)]
    [resumed] = events(sim, EventKind.TRAINING_RESUMED)
    assert dict(resumed.data) == {
        "generation": 2,
        "step": 42,
        "pause_seconds": 6.5,
        "decision_seconds": job.morph.decision_seconds,
        "paused_since": 141.5,
        "resumed_at": 148.0,
        "stalled_seconds": None,  # no rank said how long its first step took (an older agent)
    }
    assert sim.job().morph.paused_since is None and sim.job().last_step_at == 148.0
    beat_all(sim, 60, first_at=148.0, last_at=170.0)
    sim.step(1)
    assert len(events(sim, EventKind.TRAINING_RESUMED)) == 1  # measured once


def beat_first_steps(sim: Sim, step: int, first_at: float, took: dict[int, float | None]) -> None:
    """Every rank of j1's current generation completed its first step at ``first_at``; rank r's took ``took[r]``."""
    for name in sim.job().nodes:
        a = assignment_for(sim.world, name)
        assert a is not None
        sim.beat(
            name,
            *[
                RankReport("j1", a.generation, r, True, None, step, 0, first_step_at=first_at, last_step_at=first_at)
                for r in a.ranks
            ],
        )
        ranks = sim.world.observed[name].ranks
        sim.beat(name, *(replace(r, first_step_seconds=took.get(r.rank)) for r in ranks))


def morphed_after_step_at(last_at: float) -> Sim:
    """Four nodes train; one is evicted after step 41 (completed at ``last_at``); generation 2 is issued."""
    sim = started(4)
    beat_all(sim, 40, first_at=100.0, last_at=140.0)
    sim.step(1)
    evict_one(sim, 41, last_at=last_at)
    sim.step(2)
    assert sim.job().generation == 2
    return sim


def test_of_the_pause_stalled_runs_to_the_last_rank_beginning_its_first_step() -> None:
    sim = morphed_after_step_at(141.5)
    # three ranks in generation 2; rank 1 began 0.25 s after the others (its first step was shorter), rank 2 is an
    # older agent that does not say
    beat_first_steps(sim, 42, 148.0, {0: 5.5, 1: 5.25})
    sim.step(1)
    assert [c for c in sim.log if isinstance(c, RecordPause)] == [RecordPause("j1", 2, 6.5, 1.25)]
    [resumed] = events(sim, EventKind.TRAINING_RESUMED)
    assert (resumed.data["pause_seconds"], resumed.data["stalled_seconds"]) == (6.5, 1.25)


def test_stalled_stays_within_the_pause_whatever_the_clocks_say() -> None:
    for took, stalled in ((9.0, 0.0), (0.0, 6.5)):  # a first step longer than the pause; one of no time at all
        sim = morphed_after_step_at(141.5)
        beat_first_steps(sim, 42, 148.0, dict.fromkeys(range(4), took))
        sim.step(1)
        assert [c for c in sim.log if isinstance(c, RecordPause)] == [RecordPause("j1", 2, 6.5, stalled)]


def test_a_generation_that_never_stepped_carries_the_pause_to_the_next() -> None:
    sim = started(4)
    beat_all(sim, 40, first_at=100.0, last_at=140.0)
    sim.step(1)
    evict_one(sim, 41, last_at=141.0)
    sim.step(1)
    assert sim.job().generation == 2
    for name in sim.job().nodes:  # generation 2's trainers fail before their first step
        a = assignment_for(sim.world, name)
        assert a is not None
        sim.beat(name, *[RankReport("j1", 2, r, False, 1, 41, 41, error="boom") for r in a.ranks])
    sim.step(1)
    assert sim.job().state is J.MORPHING
    for name in sim.job().nodes:
        a = assignment_for(sim.world, name)
        assert a is not None
        sim.beat(name, *[RankReport("j1", 2, r, False, 1, 41, 41, error="boom") for r in a.ranks])
    sim.step(1)
    assert sim.job().generation == 3 and sim.job().morph.paused_since == 141.0
    beat_all(sim, 42, first_at=150.0, last_at=150.0)
    sim.step(1)
    assert [c for c in sim.log if isinstance(c, RecordPause)] == [RecordPause("j1", 3, 9.0)]


def test_a_skewed_clock_never_makes_a_negative_pause() -> None:
    sim = started(4)
    beat_all(sim, 40, first_at=100.0, last_at=140.0)
    sim.step(1)
    evict_one(sim, 41, last_at=141.0)
    sim.step(1)
    beat_all(sim, 42, first_at=139.0, last_at=139.0)  # a node whose clock runs 2 s behind
    sim.step(1)
    assert [c for c in sim.log if isinstance(c, RecordPause)] == [RecordPause("j1", 2, 0.0)]


def test_the_first_generation_has_a_decision_time_of_none_and_no_pause() -> None:
    sim = started(2)
    first = next(c for c in sim.log if isinstance(c, StartGeneration))
    assert first.morph_seconds is None and sim.job().morph.decision_seconds is None
    beat_all(sim, 5, first_at=10.0, last_at=15.0)
    sim.step(1)
    assert not events(sim, EventKind.TRAINING_RESUMED)


def test_the_timeline_draws_the_eval_loss_and_each_pause_beside_its_decision_time(tmp_path: Path) -> None:
    def ev(at: float, kind: str, **data: object) -> dict[str, object]:
        return {"at": at, "kind": kind, "job": "job-1", "node": None, "data": data}

    log = [
        ev(0, "GenerationIssued", generation=1, layout="1x2 (P x D), m=4", resume_step=0, cause="admitted"),
        ev(5, "EvaluationCompleted", generation=1, step=10, loss=3.5),
        ev(9, "GenerationIssued", generation=2, layout="1x1 (P x D), m=8", resume_step=12, cause="eviction"),
        ev(
            12,
            "TrainingResumed",
            generation=2,
            step=13,
            pause_seconds=4.0,
            decision_seconds=0.25,
            paused_since=7.5,
            resumed_at=11.5,
        ),
        ev(15, "EvaluationCompleted", generation=2, step=20, loss=2.75),
        ev(16, "TrainingProgressed", generation=2, step=21, loss=2.5, samples_per_second=90.0),
    ]
    timeline = build(log, "job-1", global_batch=8)
    assert timeline.evaluations == [(5.0, 10, 3.5), (15.0, 20, 2.75)]
    assert timeline.training == [(16.0, 21, 2.5)]
    assert timeline.pauses == [Pause(2, 7.5, 11.5, 4.0, 0.25)]
    page = render_html(timeline, "job-1")
    svg = ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])
    titles = [t.text or "" for t in svg.iter(f"{SVG}title")]
    assert "training paused 4.0 s before generation 2, decided in 0.2 s" in titles
    assert {"eval loss 3.5000 at step 10", "eval loss 2.7500 at step 20", "loss 2.5000 at step 21"} <= set(titles)
    assert "no loss reported yet" in render_html(build(log[:1], "job-1", 8), "job-1")
    render_png(timeline, "job-1", tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")


def test_the_watch_view_shows_the_newest_eval_loss() -> None:
    from controller.client.commands.status import watch_view

    job = {
        "id": "job-1", "name": "demo", "state": "RUNNING", "step": 150, "total_steps": 300, "generation": 2,
        "layout": None, "last_checkpoint_step": 140, "steps_lost": 0, "reason": "", "eval_loss": 1.5, "eval_step": 150,
    }  # fmt: skip
    assert "eval loss 1.5000 at step 150" in watch_view(job, None, 0.0)
    assert "eval loss" not in watch_view({**job, "eval_loss": None, "eval_step": None}, None, 0.0)


def held_at_41_after_an_eviction() -> Sim:
    """Generation 2 of a 4-node job, named step 41 that generation 1 holds in memory (20 is committed)."""
    sim = started(4)
    beat_all(sim, 20, first_at=100.0, last_at=120.0, last_checkpoint_step=20)
    sim.step(1)
    victim = sim.job().nodes[-1]
    sim.beat(victim, *sim.world.observed[victim].ranks, notice=sim.now + 30)
    sim.step(1)
    for name in sim.job().nodes:  # every rank stops at 41 and keeps it in memory: nothing newer was written
        a = assignment_for(sim.world, name)
        assert a is not None
        ranks = [RankReport("j1", 1, r, False, 0, 41, 20, last_step_at=141.0) for r in a.ranks]
        sim.beat(name, *ranks, notice=sim.now + 30 if name == victim else None)
    sim.step(2)
    return sim


def test_a_stopped_generation_names_its_step_held_in_memory_and_a_skipped_one_is_said_and_counted() -> None:
    sim = held_at_41_after_an_eviction()
    job = sim.job()
    assert job.generation == 2 and job.steps_lost == 0
    given = assignment_for(sim.world, job.nodes[0])
    assert given is not None and (given.held, given.resume.step) == (CheckpointRef(41, 1), 20)
    why = "layers 3 are held by no trainer and step 41 has no durable checkpoint"
    beat_all(sim, 21, first_at=150.0, last_at=150.0, held_skipped=why, held_skipped_cause=HeldSkipCause.LAYERS_MISSING)
    sim.step(1)
    [skipped] = events(sim, EventKind.HELD_STATE_SKIPPED)
    said = {"generation": 2, "held_step": 41, "resume_step": 20, "reason": why, "cause": "layers_missing"}
    assert dict(skipped.data) == said
    job = sim.job()
    assert (job.steps_lost, job.held, job.step) == (21, CheckpointRef(), 21)
    beat_all(sim, 22, first_at=150.0, last_at=151.0, held_skipped=why)
    sim.step(1)
    assert len(events(sim, EventKind.HELD_STATE_SKIPPED)) == 1 and sim.job().steps_lost == 21


def test_an_exchange_that_lost_a_peer_is_said_once_and_the_next_generation_resumes_from_the_committed_step() -> None:
    """A holder died mid-exchange: the survivors say why (the trainer's HeldStateSkipped) and exit 1 in the same
    report; the job morphs again, from the committed checkpoint, naming no held step."""
    sim = held_at_41_after_an_eviction()
    why = "the exchange of step 41 held by generation 1 lost a peer: Connection closed by peer; this generation ends"
    ranks = {name: a.ranks for name in sim.job().nodes if (a := assignment_for(sim.world, name)) is not None}
    for _ in range(2):  # the failure, then the same exited ranks once the abort began
        for name, mine in ranks.items():
            sim.beat(name, *[RankReport("j1", 2, r, False, 1, 20, 20, error="lost", held_skipped=why) for r in mine])
        sim.step(2)
    [skipped] = events(sim, EventKind.HELD_STATE_SKIPPED)
    assert dict(skipped.data) == {"generation": 2, "held_step": 41, "resume_step": 20, "reason": why}  # no cause said
    job = sim.job()
    assert job.generation >= 3 and job.steps_lost == 21, job
    given = assignment_for(sim.world, job.nodes[0])
    assert given is not None and (given.held.step, given.resume.step) == (0, 20), given


def test_an_aborted_generation_names_no_held_step() -> None:
    sim = started(2)
    beat_all(sim, 10, first_at=100.0, last_at=110.0)
    sim.step(1)
    victim = sim.job().nodes[-1]
    for name in sim.job().nodes:  # one node's trainers crash: the morph aborts, nothing is held
        a = assignment_for(sim.world, name)
        assert a is not None
        code = 1 if name == victim else None
        sim.beat(name, *[RankReport("j1", 1, r, code is None, code, 10, 0, error="boom") for r in a.ranks])
    sim.step(1)
    for name in sim.job().nodes:
        a = assignment_for(sim.world, name)
        if a is not None and a.generation == 1:
            sim.beat(name, *[RankReport("j1", 1, r, False, 137, 10, 0) for r in a.ranks])
    sim.step(2)
    job = sim.job()
    assert job.generation == 2 and job.held.step == 0
