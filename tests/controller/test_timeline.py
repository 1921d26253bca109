"""The timeline picture, rendered from an event log like the controller writes."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from controller.client.timeline import build, render_html
from controller.eventlog import facts
from controller.eventlog.fact import EventDataError, Fact
from controller.eventlog.schema import Logged
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.helpers import REPO
from tests.runtime.helpers import Result, run

SVG = "{http://www.w3.org/2000/svg}"


def _events() -> list[dict[str, Any]]:
    def ev(at: float, fact: Fact, job: str | None = None, node: str | None = None) -> dict[str, Any]:
        return Logged(at, job, node, fact).as_json()

    def moved(source: str, target: str) -> facts.NodeStateChanged:
        return facts.NodeStateChanged(source, target, "a cause", "a reason")

    return [
        ev(0, facts.NodeRegistered(1, 1, "node-1:7000"), node="node-1"),
        ev(0, moved("JOINING", "READY"), node="node-1"),
        ev(1, facts.NodeRegistered(1, 1, "node-2:7000"), node="node-2"),
        ev(1, moved("JOINING", "READY"), node="node-2"),
        ev(2, facts.GenerationIssued(1, "1x4 (P x D), m=4", 0, "admitted"), "job-1"),
        ev(12, facts.CheckpointCommitted(1, 100), "job-1"),
        ev(13, facts.EvictionNoticed(40.0), "job-1", "node-2"),
        ev(14, facts.GenerationIssued(2, "1x2 (P x D), m=4", 110, "eviction"), "job-1"),
        ev(20, moved("DRAINING", "GONE"), node="node-2"),
        ev(34, facts.CheckpointCommitted(2, 210), "job-1"),
        ev(35, facts.CheckpointCommitted(1, 999), "job-2"),
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


def test_data_the_timeline_cannot_read_is_refused_naming_the_event() -> None:
    events = _events()
    events[4]["data"]["resume_step"] = "110"  # a renamed or retyped field: no silent zero in the picture
    with pytest.raises(EventDataError, match="GenerationIssued event, field resume_step: expected int"):
        build(events, "job-1", 16)


def test_empty_log_renders() -> None:
    page = render_html(build([], "job-9", 8), "job-9")
    ET.fromstring(page[page.index("<svg") : page.index("</svg>") + 6])


def test_watch_view_shows_progress_layout_and_time_since_the_last_morph() -> None:
    from controller.client.commands.status import watch_view

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


def test_png_has_the_generation_bands_in_their_colours(tmp_path: Path) -> None:
    import matplotlib.image

    from controller.client.timeline_png import COLOURS, render_png

    out = tmp_path / "job.png"
    render_png(build(_events(), "job-1", 16), "job-1", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[0] > 400 and pixels.shape[1] > 800
    colours = {tuple(round(float(c) * 255) for c in p[:3]) for p in pixels.reshape(-1, pixels.shape[2])[::7]}

    def near(hex_colour: str) -> bool:
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        blended = tuple(round(0.7 * c + 0.3 * 255) for c in rgb)  # alpha 0.7 over white
        return any(all(abs(a - b) <= 3 for a, b in zip(p, blended, strict=True)) for p in colours)

    assert near(COLOURS[1 % len(COLOURS)]) and near(COLOURS[2 % len(COLOURS)])
    assert not near(COLOURS[3 % len(COLOURS)]), "a generation that never ran has no band"


def test_empty_log_renders_a_png(tmp_path: Path) -> None:
    from controller.client.timeline_png import render_png

    render_png(build([], "job-9", 8), "job-9", tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 0


def _timeline_cli(live: Live, *args: str) -> Result:
    command = [sys.executable, "-m", "spotmorph.cli", "timeline", *args]
    command += ["--controller", live.address, "--token", live.token("operator")]
    return run(command, timeout=120)


@pytest.mark.slow
def test_cli_writes_html_and_png_for_a_real_job_and_rejects_bad_output(live: Live, tmp_path: Path) -> None:
    jobs = live.jobs()
    spec = pb.JobSpec(
        name="demo",
        entrypoint=f"{REPO / 'examples' / 'tiny_gpt.py'}:build",
        global_batch=8,
        steps=20,
        checkpoint_dir=str(tmp_path / "ckpt"),
        profile=str(live.profile),
    )
    job = jobs.SubmitJob(pb.SubmitJobRequest(spec=spec)).id
    for name in ("t.html", "t.png"):
        done = _timeline_cli(live, job, "--out", str(tmp_path / name))
        assert done.returncode == 0, done.stderr
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    wrong = _timeline_cli(live, job, "--out", str(tmp_path / "t.svg"))
    assert wrong.returncode == 2 and ".png" in wrong.stderr and ".html" in wrong.stderr
    unwritable = _timeline_cli(live, job, "--out", str(tmp_path / "missing-dir" / "t.png"))
    assert unwritable.returncode == 2 and "cannot write" in unwritable.stderr
    unknown = _timeline_cli(live, "job-999", "--out", str(tmp_path / "u.png"))
    assert unknown.returncode != 0 and "job-999" in unknown.stderr
