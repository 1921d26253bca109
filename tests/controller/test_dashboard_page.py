"""The dashboard page in a driven headless Chromium, from a realistic run (issue 45): charts with axes, a log
scale and values under the pointer, a line where each generation resumed, the throughput, jobs compared on one
chart, and the newest events filtered by kind with runs of checkpoint events folded.

The run: job-1 trains through two evictions (three generations: two slots, one, two) beside job-2, both
reporting loss, rate, evaluations and checkpoints over the agent wire as trainers do. With
``SPOTMORPH_SCREENSHOTS=1`` the test also writes ``docs/dashboard.png`` and ``docs/dashboard-compare.png``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protos.spotmorph.v1 import controller_pb2 as pb
from tests.browser import Driven, needs_chromium
from tests.controller.conftest import Live
from tests.controller.test_dashboard import state
from tests.controller.test_hostile_edge import Node, running_job, wait_for

DOCS = Path(__file__).resolve().parents[2] / "docs"
EVERY = 4  # steps between reports
CHECKPOINTS = 8  # steps between checkpoints


@dataclass
class Run:
    """One job's trainers as its node reports them."""

    node: Node
    job: str
    generation: int
    ranks: list[int]
    scale: float  # how fast its loss falls (its learning rate, as it were)
    rate: float  # samples/s per slot
    step: int = 0
    first_at: float | None = None  # when this generation's first step was (the trainers' clock)

    def statuses(self, **fields: Any) -> list[pb.TrainerStatus]:
        step, now = self.step, time.time()
        self.first_at = self.first_at or now
        loss = 0.9 + 1.9 * math.exp(-step / self.scale) + 0.03 * math.sin(step / 3)
        said: dict[str, Any] = {"loss": loss, "samples_per_second": self.rate * len(self.ranks) + 8 * math.sin(step)}
        said |= {"first_step_at": self.first_at, "first_step_seconds": 0.4, "last_step_at": now}
        if step % 40 == 4:
            said |= {"eval_step": step, "eval_loss": loss + 0.12}
        if step % CHECKPOINTS == 0:
            said |= {"last_checkpoint_step": step, "checkpoint_stall_seconds": 0.08, "checkpoint_stall_step": step}
        said |= fields
        return [
            pb.TrainerStatus(job=self.job, generation=self.generation, rank=rank, running=True, last_step=step, **said)
            for rank in self.ranks
        ]

    def stopped(self, **fields: Any) -> list[pb.TrainerStatus]:
        """Its ranks exited at their step (a stop for an eviction, or the job's end)."""
        return [replace_running(s, running=False, exit_code=0, **fields) for s in self.statuses()]


def replace_running(status: pb.TrainerStatus, **fields: Any) -> pb.TrainerStatus:
    changed = pb.TrainerStatus()
    changed.CopyFrom(status)
    for name, value in fields.items():
        setattr(changed, name, value)
    return changed


def job_state(live: Live, job: str) -> dict[str, Any]:
    return next(shown for shown in state(live)["jobs"] if shown["id"] == job)


def heard(live: Live, runs: list[Run]) -> bool:
    steps = {job["id"]: job["loss_curve"][-1][0] if job["loss_curve"] else 0 for job in state(live)["jobs"]}
    return all(steps.get(run.job) == run.step for run in runs)


def train(live: Live, runs: list[Run], until: int, idle: tuple[Node, ...] = ()) -> None:
    """Every run reports every EVERY steps up to ``until`` (each report heard before the next)."""
    while any(run.step < until for run in runs):
        for run in runs:
            run.step = min(run.step + EVERY, until) if run.step < until else run.step
            run.node.beat(*run.statuses())
            if run.step % CHECKPOINTS == 0:
                commit = pb.CheckpointCommitted(job=run.job, generation=run.generation, step=run.step)
                run.node.report(checkpoint_committed=commit)
        for node in idle:
            node.beat()
        wait_for(lambda: heard(live, runs), "the reports to reach the dashboard")


def evict(live: Live, run: Run, others: list[Run], slots: int) -> None:
    """``run``'s node is evicted: its ranks stop at their step and the next generation goes to a new node."""
    notice = pb.EvictionNotice(not_before=time.time() + 30, source="imds")
    run.node.beat(*run.statuses(), eviction=notice)
    spare = Node(live, slots=slots)
    spare.beat()
    run.node.beat(*run.stopped(), eviction=notice)
    for other in others:
        other.node.beat(*other.statuses())
    wait_for(lambda: job_state(live, run.job)["generation"] == run.generation + 1, "the next generation")
    assignment = spare.beat().assignment
    assert assignment.job == run.job, assignment
    run.node, run.generation, run.ranks, run.first_at = spare, assignment.generation, list(assignment.ranks), None


def scene(live: Live) -> tuple[Run, Run]:
    """job-1 (300 steps, evicted at 100 and 180) and job-2 (200 steps, then done) trained side by side."""
    node, job, generation = running_job(live, steps=300, name="tiny-gpt", checkpoint_dir=str(live.state_dir / "c1"))
    first = Run(node, job, generation, list(node.beat().assignment.ranks), scale=60, rate=305)
    node, job, generation = running_job(
        live, steps=200, name="tiny-gpt-lr-low", checkpoint_dir=str(live.state_dir / "c2")
    )
    second = Run(node, job, generation, list(node.beat().assignment.ranks), scale=110, rate=290)
    train(live, [first, second], 100)
    evict(live, first, [second], slots=1)
    train(live, [first, second], 180)
    evict(live, first, [second], slots=2)
    train(live, [first, second], 200)
    second.node.beat(*second.stopped())
    wait_for(lambda: job_state(live, second.job)["state"] == "SUCCEEDED", "job-2 to end")
    train(live, [first], 240, idle=(second.node,))
    return first, second


CHARTS = """[...document.querySelectorAll('svg.chart')].map(c => ({
  key: c.dataset.chart, scale: c.dataset.scale,
  x: [...c.querySelectorAll('.x-tick')].map(t => t.textContent),
  y: [...c.querySelectorAll('.y-tick')].map(t => t.textContent),
  markers: [...c.querySelectorAll('.morph-marker')].map(m => [m.dataset.step, m.querySelector('text').textContent]),
  lines: [...c.querySelectorAll('polyline')].map(p => p.dataset.series)}))"""


def center(page: Driven, selector: str) -> tuple[float, float, str]:
    """Where the element ``selector`` finds is on the screen, and its data-value."""
    script = f"""(() => {{ const c = document.querySelector({json.dumps(selector)}), b = c.getBoundingClientRect();
        return [b.x + b.width / 2, b.y + b.height / 2, c.dataset.value]; }})()"""
    x, y, value = page.evaluate(script)
    return x, y, value


def charts(page: Driven) -> dict[str, dict[str, Any]]:
    return {chart["key"]: chart for chart in page.evaluate(CHARTS)}


def rows(page: Driven, selector: str) -> list[list[str]]:
    """The cells' text of the rows ``selector`` finds."""
    script = f"[...document.querySelectorAll({selector!r})].map(r => [...r.cells].map(c => c.textContent))"
    return list(page.evaluate(script))


def assert_axes_markers_and_throughput(page: Driven, first: Run, second: Run) -> None:
    shown = charts(page)
    loss, rate = shown[f"{first.job}:loss"], shown[f"{first.job}:rate"]
    assert loss["lines"] == ["loss", "eval loss"] and rate["lines"] == ["samples/s"]
    for chart in (loss, rate):
        steps = [int(x) for x in chart["x"]]
        assert len(steps) >= 4 and steps == sorted(steps) and steps[-1] >= 200, chart
        assert len(chart["y"]) >= 3 and chart["scale"] == "linear", chart
        assert chart["markers"] == [["0", "g1 admitted"], ["100", "g2 eviction"], ["180", "g3 eviction"]], chart
    assert shown[f"{second.job}:loss"]["markers"] == [["0", "g1 admitted"]]
    assert shown["compare"]["lines"] == [f"{first.job} tiny-gpt", f"{second.job} tiny-gpt-lr-low"]
    morphs = rows(page, f"#job-{first.job} table.morphs tr")
    assert [r[4] for r in morphs] == ["resumed at step", "0", "100", "180"], morphs
    assert page.evaluate(f"document.querySelectorAll('#job-{first.job} circle.rate-point').length") >= 50


def assert_log_scale_and_hover(page: Driven, first: Run) -> None:
    key = f"{first.job}:loss"
    page.click(f'input.log-toggle[data-chart="{key}"]')
    logged = charts(page)[key]
    assert logged["scale"] == "log" and len(logged["y"]) >= 2, logged
    assert all(float(v) / 10 ** math.floor(math.log10(float(v))) in (1, 2, 5) for v in logged["y"]), logged
    point = center(page, f'#job-{first.job} circle.loss-point[data-step="152"]')
    page.move_mouse(point[0], point[1])
    tip = f"document.querySelector('.figure[data-chart=\"{key}\"] .tooltip')"
    assert page.wait(f"!{tip}.hidden && {tip}.textContent")
    text = page.evaluate(f"{tip}.textContent")
    assert text.startswith("step 152") and f"loss: {float(point[2]):.4g}" in text and "eval loss: " in text, text
    assert page.evaluate(f"document.querySelector('svg[data-chart=\"{key}\"] .crosshair').dataset.step") == "152"


def assert_events_filtered_and_folded(page: Driven) -> None:
    kinds = page.evaluate("[...document.querySelectorAll('input.kind-filter')].map(i => i.dataset.kind)")
    assert {"CheckpointCommitted", "CheckpointStallMeasured", "GenerationIssued", "EvictionNoticed"} <= set(kinds)
    folds = rows(page, "tr.fold")
    assert folds and all(" checkpoint events (steps " in r[0] for r in folds), folds
    shown = page.evaluate("[...document.querySelectorAll('#events tr[data-kind]')].map(r => r.dataset.kind)")
    total = page.evaluate("ui.state.events.filter(e => e.checkpoint).length")
    assert sum(k.startswith("Checkpoint") for k in shown) < total / 4 and "GenerationIssued" in shown
    issued = [r for r in rows(page, "#events tr[data-kind=GenerationIssued]") if "generation 3" in r[5]]
    # Named in its checkpoint (step 176) and in the memory its ranks held (step 180): it started from 180.
    assert issued and "resume step 176, held step 180" in issued[0][5] and "cause eviction" in issued[0][5], issued
    count = int(page.evaluate("document.querySelector('tr.fold').dataset.count"))
    page.click("tr.fold button.expand")
    assert page.evaluate("document.querySelectorAll('tr.folded').length") == count
    page.click('input.kind-filter[data-kind="GenerationIssued"]')
    assert not rows(page, "#events tr[data-kind=GenerationIssued]")


@pytest.mark.slow
@needs_chromium
def test_charts_comparison_and_events_in_a_driven_browser(live: Live) -> None:
    first, second = scene(live)
    url = f"http://127.0.0.1:{live.controller.metrics_port}/#token={live.token('reader')}"
    with Driven(url, size=(1100, 1000)) as page:
        page.wait("document.querySelectorAll('svg.chart circle').length > 100")
        assert_axes_markers_and_throughput(page, first, second)
        if os.environ.get("SPOTMORPH_SCREENSHOTS"):
            screenshots(page, first)
        assert_log_scale_and_hover(page, first)
        assert_events_filtered_and_folded(page)
        page.click(f'input.compare-pick[data-job="{second.job}"]')
        assert charts(page)["compare"]["lines"] == [f"{first.job} tiny-gpt"]
        time.sleep(3.5)  # the page asks again and redraws: what the user chose stays
        assert charts(page)[f"{first.job}:loss"]["scale"] == "log" and charts(page)["compare"]["lines"] == [
            f"{first.job} tiny-gpt"
        ]
        assert page.evaluate("document.querySelectorAll('tr.folded').length") > 0
        assert not rows(page, "#events tr[data-kind=GenerationIssued]")
        assert page.evaluate("!document.querySelector('.tooltip:not([hidden])').hidden")  # still under the pointer


def screenshots(page: Driven, first: Run) -> None:
    """docs/dashboard.png (the top: nodes and job-1, its loss under the pointer) and docs/dashboard-compare.png
    (the comparison, and the newest events with their runs of checkpoint events folded)."""
    page.move_mouse(*center(page, f'#job-{first.job} circle.loss-point[data-step="140"]')[:2])
    page.wait("!document.querySelector('.tooltip').hidden")
    bottom = page.evaluate("document.querySelector('#jobs > div.job').getBoundingClientRect().bottom + scrollY + 12")
    page.screenshot(DOCS / "dashboard.png", clip=(0, 0, 1100, bottom))
    page.move_mouse(1, 1)
    heading = "document.querySelector('#compare').previousElementSibling.getBoundingClientRect().top + scrollY - 16"
    page.screenshot(DOCS / "dashboard-compare.png", clip=(0, page.evaluate(heading), 1100, 1000))
