"""The timeline picture, rendered from an event log like the controller writes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from controller.timeline import build, render_html

SVG = "{http://www.w3.org/2000/svg}"


def _events() -> list[dict[str, object]]:
    def ev(at: float, kind: str, job: str | None = None, node: str | None = None, **data: object) -> dict[str, object]:
        return {"at": at, "kind": kind, "job": job, "node": node, "data": data}

    return [
        ev(0, "NodeRegistered", node="node-1"),
        ev(0, "NodeStateChanged", node="node-1", **{"from": "JOINING", "to": "READY"}),
        ev(1, "NodeRegistered", node="node-2"),
        ev(1, "NodeStateChanged", node="node-2", **{"from": "JOINING", "to": "READY"}),
        ev(2, "GenerationIssued", "job-1", generation=1, layout="1x4 (P x D), m=4", resume_step=0, cause="admitted"),
        ev(12, "CheckpointCommitted", "job-1", generation=1, step=100),
        ev(13, "EvictionNoticed", "job-1", "node-2", not_before=40),
        ev(14, "GenerationIssued", "job-1", generation=2, layout="1x2 (P x D), m=4", resume_step=110, cause="eviction"),
        ev(20, "NodeStateChanged", node="node-2", **{"from": "DRAINING", "to": "GONE"}),
        ev(34, "CheckpointCommitted", "job-1", generation=2, step=210),
        ev(35, "CheckpointCommitted", "job-2", generation=1, step=999),
    ]


def test_timeline_follows_nodes_generations_and_throughput() -> None:
    timeline = build(_events(), "job-1", global_batch=16)
    assert [n for _, n in timeline.nodes] == [1, 2, 1]
    assert [(g.number, g.layout) for g in timeline.generations] == [(1, "1x4 (P x D), m=4"), (2, "1x2 (P x D), m=4")]
    assert timeline.checkpoints == [(12.0, 100), (34.0, 210)]
    assert timeline.throughput == [(2.0, 12.0, 160.0), (14.0, 34.0, 80.0)]
    assert {kind for _, kind, _ in timeline.marks} == {"arrival", "eviction", "loss"}


def test_rendered_page_is_self_contained_svg() -> None:
    page = render_html(build(_events(), "job-1", 16), "job-1 <demo>")
    assert "job-1 &lt;demo&gt;" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")
    svg = ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])
    bands = [r for r in svg.iter(f"{SVG}rect") if r.get("opacity") == "0.7"]
    assert len(bands) == 2
    assert any("1x2" in (t.text or "") for t in svg.iter(f"{SVG}text"))


def test_empty_log_renders() -> None:
    page = render_html(build([], "job-9", 8), "job-9")
    ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])


def test_watch_view_shows_progress_layout_and_time_since_the_last_morph() -> None:
    from controller.commands.status import watch_view

    job = {
        "id": "job-1",
        "name": "demo",
        "state": "RUNNING",
        "step": 150,
        "total_steps": 300,
        "generation": 2,
        "layout": {"pipeline_stages": 1, "data_parallel": 2, "micro_batch_size": 4},
        "last_checkpoint_step": 140,
        "steps_lost": 0,
        "reason": "",
    }
    view = watch_view(job, last_morph_at=100.0, now=130.0, width=10)
    assert "[#####.....] 150/300 steps" in view
    assert "layout 1x2 m=4" in view
    assert "last morph 30s ago" in view
    assert "last morph never" in watch_view(job, None, 130.0)
