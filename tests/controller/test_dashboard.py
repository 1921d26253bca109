"""The web dashboard through a real controller: its page, and the JSON the page draws, for readers only.

A node reports a job's loss, evaluation and rate over the agent wire; the JSON the page asks for shows the
node, the job's layout, its loss and eval curves, its morph timeline and the newest events. Without a token,
or with one that is no operator's or reader's, the data is refused (401, 403) and nothing is shown. Job
reasons and event text come from users and nodes: the page puts every string in as text, never as HTML.
"""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.error
import urllib.request
from typing import Any

import pytest

from controller.core.causes import MorphCause
from controller.core.lifecycle import JobState
from controller.core.records import JobRecord, Training
from controller.eventlog import facts, provider_facts
from controller.eventlog.fact import Fact
from controller.eventlog.schema import fact_classes
from controller.observability.curves import LossCurves
from controller.observability.dashboard import API_PATH, HTML
from controller.observability.dashboard_views import DETAIL_CHARS, NAMED, SKIPPED, curve, event_view, job_view
from controller.persistence.codec import EventRow, GenerationRow
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.browser import needs_chromium, parse, rendered
from tests.controller.conftest import Live
from tests.controller.helpers import job as make_job
from tests.controller.test_hostile_edge import running_job, wait_for


def get(live: Live, path: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{live.controller.metrics_port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def state(live: Live) -> dict[str, Any]:
    code, headers, body = get(live, API_PATH, live.token("reader"))
    assert code == 200 and headers["Content-Type"].startswith("application/json"), (code, body)
    return dict(json.loads(body))


def test_the_page_is_served_whole_with_a_policy_that_allows_nothing_from_elsewhere(live: Live) -> None:
    code, headers, body = get(live, "/")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert body.decode() == HTML and API_PATH in HTML
    policy = headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Cache-Control"] == "no-store"
    assert "innerHTML" not in HTML and "insertAdjacentHTML" not in HTML  # users' text goes in as text only


def test_the_data_needs_an_operator_or_reader_token(live: Live) -> None:
    for token in (None, "not-a-token", ""):
        code, headers, body = get(live, API_PATH, token)
        assert code == 401 and b"token" in body and "Bearer" in headers.get("WWW-Authenticate", ""), (token, code)
    code, _, body = get(live, API_PATH, live.agent_token("vm-dash"))
    assert code == 403 and b"operator or reader" in body
    assert get(live, API_PATH, live.token("operator"))[0] == 200
    assert get(live, "/api/v1/other", live.token("reader"))[0] == 404


def test_the_dashboard_shows_nodes_layouts_curves_morphs_and_events(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100)

    def report(step: int, loss: float) -> None:
        node.beat(
            pb.TrainerStatus(
                job=job_id,
                generation=generation,
                rank=0,
                running=True,
                last_step=step,
                loss=loss,
                samples_per_second=64.0,
            )
        )
        wait_for(lambda: state(live)["jobs"][0]["step"] == step, f"step {step} to reach the dashboard")

    report(10, 2.5)
    report(20, 2.25)
    evaluated = pb.TrainerStatus(
        job=job_id, generation=generation, rank=0, running=True, last_step=20, eval_step=20, eval_loss=2.75
    )
    node.beat(evaluated)
    wait_for(lambda: state(live)["jobs"][0]["eval_curve"], "the evaluation to reach the dashboard")
    shown = state(live)
    (listed,) = [n for n in shown["nodes"] if n["name"] == node.name]
    assert listed["state"] in ("ASSIGNED", "RUNNING") and listed["job"] == job_id and listed["gpus"] == []
    (job,) = shown["jobs"]
    assert job["id"] == job_id and job["state"] == "RUNNING" and job["generation"] == generation
    layout = job["layout"]
    assert layout["stages"] * layout["replicas"] == len(layout["placement"]) >= 1
    assert {slot["node"] for slot in layout["placement"]} == {node.name}
    assert layout["stage_layers"][0][0] == 0
    assert job["loss"] == 2.25 and job["samples_per_second"] == 64.0 and job["eval_loss"] == 2.75
    assert job["loss_curve"][0] == [10.0, 2.5]  # the first report is an event; later ones at most once a period
    assert job["eval_curve"] == [[20.0, 2.75]]
    assert [m["generation"] for m in job["morphs"]] == [generation] and job["morphs"][0]["cause"]
    kinds = [e["kind"] for e in shown["events"]]
    assert "GenerationIssued" in kinds and "EvaluationCompleted" in kinds
    assert [e["seq"] for e in shown["events"]] == sorted((e["seq"] for e in shown["events"]), reverse=True)


@pytest.mark.slow
@needs_chromium
def test_a_browser_shows_the_node_the_layout_the_curves_and_the_morph_and_nothing_without_a_token(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100)
    node.beat(
        pb.TrainerStatus(
            job=job_id,
            generation=generation,
            rank=0,
            running=True,
            last_step=10,
            loss=2.5,
            eval_step=10,
            eval_loss=2.75,
        )
    )
    wait_for(lambda: state(live)["jobs"][0]["eval_curve"], "the evaluation to reach the dashboard")
    base = f"http://127.0.0.1:{live.controller.metrics_port}/"
    page = parse(rendered(f"{base}#token={live.token('reader')}"))
    assert len(page.find("tr", data_node=node.name)) == 1
    assert page.find("div", data_job=job_id) and page.find("span", **{"class": "state-RUNNING"})
    assert page.find("circle", data_step="10", data_value="2.5") and page.find(
        "circle", data_step="10", data_value="2.75"
    )
    shown = page.text()
    assert f"{node.name} #0" in shown and "stage 0 (layers 0-" in shown  # the layout grid: rank 0's slot
    assert "step 10 of 100" in shown and "loss 2.5000" in shown and "eval loss 2.7500" in shown
    assert "admitted" in shown and "GenerationIssued" in shown  # the morph timeline and the events
    locked = parse(rendered(base))
    assert not locked.find("tr", data_node=node.name) and "a token is needed" in locked.text()
    refused = parse(rendered(f"{base}#token=not-a-token"))
    assert not refused.find("tr", data_node=node.name) and "the token was refused (401)" in refused.text()


def test_loss_curves_keep_each_step_once_redo_after_a_resume_and_thin_when_full() -> None:
    def at(step: int, loss: float, job: str = "job-1") -> JobRecord:
        return make_job(job, JobState.RUNNING, training=Training(loss, step))

    curves = LossCurves(limit=4)
    for step in (1, 2, 2, 3):
        curves.observe([at(step, 10.0 - step)])
    assert curves.of("job-1") == [(1, 9.0), (2, 8.0), (3, 7.0)]  # a heartbeat with nothing new adds nothing
    assert curves.rates_of("job-1") == []  # no rate heard: no rate point
    curves.observe([at(2, 8.5)])  # a new generation resumed from step 1: its steps replace the old ones
    assert curves.of("job-1") == [(1, 9.0), (2, 8.5)]
    for step in (3, 4, 5):
        curves.observe([at(step, 1.0)])
    assert curves.of("job-1") == [(1, 9.0), (3, 1.0), (5, 1.0)]  # past 4 points, every other one stays
    curves.observe([at(6, math.nan)])
    assert curves.of("job-1")[-1] == (5, 1.0)  # no finite loss, no point
    curves.observe([make_job("job-2", JobState.QUEUED)])
    assert curves.of("job-1") == [] and curves.of("job-2") == []  # job-1 left the store (retention)


def test_a_curve_drops_the_steps_a_newer_generation_redid_and_takes_what_was_heard_after_its_events() -> None:
    points = [(1, 10, 3.0), (1, 20, 2.0), (1, 30, 1.5), (2, 20, 2.1), (2, 25, 1.9), (2, 40, 1.2)]  # resumed at 15
    assert curve(points) == [[10.0, 3.0], [20.0, 2.1], [25.0, 1.9], [40.0, 1.2]]
    heard = [(30, 1.4), (35, 1.3)]  # what this controller heard since it started, from step 30 on
    assert curve(points, heard) == [[10.0, 3.0], [20.0, 2.1], [25.0, 1.9], [30.0, 1.4], [35.0, 1.3]]
    assert curve([*points, (2, 45, None), (2, 50, math.nan), (2, 55, 9e99)])[-1] == [55.0, 9e99]  # no loss: no point


def test_the_curves_come_from_the_facts_the_rows_hold_and_a_row_that_is_none_draws_nothing() -> None:
    def progressed(seq: int, data: dict[str, Any]) -> EventRow:
        return EventRow(seq, float(seq), "TrainingProgressed", "job-1", None, data)

    rows = [progressed(1, {"generation": 1, "step": 10, "loss": 3.0, "samples_per_second": None})]
    rows += [progressed(2, {"generation": 1, "step": "x", "loss": 1.0, "samples_per_second": None})]
    rows += [progressed(3, {"generation": 1, "step": 20, "loss": 2.0})]  # no samples_per_second: not a fact
    evaluated = [EventRow(4, 4.0, "EvaluationCompleted", "job-1", None, {"generation": 1, "step": 10, "loss": 2.5})]
    events = {"TrainingProgressed": rows, "EvaluationCompleted": evaluated}
    shown = job_view(make_job("job-1", JobState.RUNNING), [], events)
    assert (shown["loss_curve"], shown["eval_curve"], shown["rate_curve"]) == ([[10.0, 3.0]], [[10.0, 2.5]], [])
    assert event_view(rows[1])["detail"].startswith("cannot read: TrainingProgressed event, field step: expected int")


def test_rates_are_kept_beside_losses_and_a_rate_curve_comes_from_the_events_and_what_was_heard() -> None:
    curves = LossCurves(limit=4)
    for step, rate in ((1, 100.0), (2, 120.0), (3, math.inf)):
        curves.observe([make_job("job-1", JobState.RUNNING, training=Training(2.0 - step / 10, step, rate))])
    assert curves.rates_of("job-1") == [(1, 100.0), (2, 120.0)]  # no finite rate, no point
    data = {"generation": 1, "step": 1, "loss": 2.0, "samples_per_second": 90.0}
    rows = [EventRow(1, 1.0, "TrainingProgressed", "job-1", None, data)]
    shown = job_view(make_job("job-1", JobState.RUNNING), [], {"TrainingProgressed": rows}, rates=[(2, 120.0)])
    assert shown["rate_curve"] == [[1.0, 90.0], [2.0, 120.0]]


def generation(number: int, resume_step: int, cause: MorphCause, held_step: int = 0) -> GenerationRow:
    layout = {"pipeline_stages": 1, "data_parallel": 2}
    return GenerationRow("job-1", number, layout, resume_step, str(cause), 0.1, 10.0, cause, held_step=held_step)


def test_a_morph_says_the_step_it_resumed_at_the_memory_held_when_newer_than_its_checkpoint() -> None:
    """Issue 45: the morph table showed resume_step 140 while the generation started from the held step 159."""
    rows = [generation(1, 0, MorphCause.OTHER), generation(2, 140, MorphCause.EVICTION, held_step=159)]
    rows += [generation(3, 200, MorphCause.GROW), generation(4, 230, MorphCause.NODE_LOST, held_step=229)]
    morphs = job_view(make_job("job-1", JobState.RUNNING), rows, {})["morphs"]
    assert [(m["resume_step"], m["resumed_at_step"]) for m in morphs] == [(0, 0), (140, 159), (200, 200), (230, 230)]
    assert morphs[1]["cause"] == "eviction" and morphs[1]["shape"] == "1x2"


def test_an_events_detail_is_short_words_of_its_fact_and_nothing_from_a_node_is_markup() -> None:
    def shown(fact: Fact) -> dict[str, Any]:
        return event_view(EventRow(7, 1.0, str(fact.kind), "job-1", "node-1", fact.data()))

    issued = facts.GenerationIssued(2, "1x2 (P x D), m=4", 140, "eviction notice: node-1", 1, 159, 1, "eviction")
    view = shown(issued)
    assert view["detail"] == (
        "generation 2, resume step 140, held step 159, layout 1x2 (P x D), m=4, cause eviction notice: node-1"
    )
    assert (view["step"], view["checkpoint"]) == (None, False)
    first = shown(facts.GenerationIssued(1, "1x2 (P x D), m=4", 0, "admitted", morph_cause="admitted"))
    assert first["detail"] == "generation 1, resume step 0, layout 1x2 (P x D), m=4, cause admitted"  # no held step
    change = shown(facts.JobStateChanged("RUNNING", "MORPHING", "eviction", "node-1"))
    assert change["detail"] == "RUNNING -> MORPHING, cause eviction, node-1"
    committed = shown(facts.CheckpointCommitted(1, 40))
    assert committed == {**committed, "step": 40, "checkpoint": True, "detail": "generation 1, step 40"}
    stall = shown(facts.CheckpointStallMeasured(1, 40, 0.123456))["detail"]
    assert stall == "generation 1, step 40, stalled 0.1235 s"
    hostile = shown(
        provider_facts.ProviderError("vmss", "<img src=x onerror=alert(1)>\x1b[2J" + "A" * 10_000, "op", None)
    )
    assert len(hostile["detail"]) <= DETAIL_CHARS and "\x1b" not in hostile["detail"]
    assert hostile["detail"].startswith("<img src=x onerror=alert(1)> [2J")  # words: the page puts them in as text
    registered = shown(facts.NodeRegistered(1, 2, "10.0.0.1:7000", [{"index": 0, "name": "H100"}]))["detail"]
    assert "gpus" not in registered and "{" not in registered  # nested data is no detail
    damaged: Any = ["not", "a", "dict"]  # a row no controller wrote
    assert event_view(EventRow(7, 1.0, "NodeRegistered", None, "node-1", damaged))["detail"] == (
        "cannot read: NodeRegistered event: expected an object, got list ['not', 'a', 'dict']"
    )
    assert (
        event_view(EventRow(7, 1.0, "CheckpointCommitted", None, None, {"generation": 1, "step": True}))["step"] is None
    )


def test_every_field_the_detail_names_is_a_field_of_some_fact() -> None:
    """A field renamed by its writer must not silently drop out of the words the dashboard shows."""
    fields = {f.name for cls in fact_classes().values() for f in dataclasses.fields(cls)}
    assert {name for name, _ in NAMED} | SKIPPED <= fields
