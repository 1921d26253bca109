"""One picture of a job over time, from the controller's event log: a self-contained HTML page.

Pure: events (as ``spotmorph events --json`` prints them) in, HTML with inline SVG out. Panels share
the time axis: nodes available, samples/s between checkpoints, the generations as bands labelled
with their layout, and the training and evaluation losses; evictions, losses and arrivals are marked on the nodes
panel, checkpoints (with how long each paused training) on the throughput panel, and on the
generations panel the pause each morph caused (from ``TrainingResumed``: the last step before it to
the first after it, on the trainers' clocks).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.eventlog import facts
from controller.eventlog.fact import Fact
from controller.eventlog.kinds import EventKind
from controller.eventlog.schema import decode

LIVE = frozenset({"READY", "ASSIGNED", "DRAINING"})
WIDTH, PANEL, MARGIN = 960, 150, 60


@dataclass(frozen=True)
class Generation:
    number: int
    start: float
    layout: str
    cause: str


@dataclass(frozen=True)
class Pause:
    generation: int
    start: float  # the last step before the morph (trainers' clock)
    end: float  # the new generation's first step
    seconds: float
    decision_seconds: float | None  # the controller's part: the morph's start to the generation's issue
    stalled_seconds: float | None = None  # of ``seconds``, the time no rank could step (None: unsaid)


@dataclass
class Timeline:
    job: str
    start: float = 0.0
    end: float = 0.0
    nodes: list[tuple[float, int]] = field(default_factory=list)  # (time, nodes available from then on)
    throughput: list[tuple[float, float, float]] = field(default_factory=list)  # (from, to, samples/s)
    checkpoints: list[tuple[float, int]] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)
    marks: list[tuple[float, str, str]] = field(default_factory=list)  # (time, kind, node)
    pauses: list[Pause] = field(default_factory=list)
    evaluations: list[tuple[float, int, float]] = field(default_factory=list)  # (time, step, eval loss)
    training: list[tuple[float, int, float]] = field(default_factory=list)  # (time, step, training loss)
    stalls: dict[int, float] = field(default_factory=dict)  # checkpoint step -> how long it paused training (s)


def build(events: Iterable[Mapping[str, Any]], job: str, global_batch: int) -> Timeline:
    """The timeline of ``job`` (cluster-wide node counts, the job's own generations and progress), from events
    as ``spotmorph events --json`` gives them; their data is decoded into the facts the controller wrote, and
    data that is not raises :class:`~controller.eventlog.fact.EventDataError` naming the kind and the field."""
    timeline = Timeline(job)
    states: dict[str, str] = {}
    times: list[float] = []
    last_checkpoint: tuple[float, int] | None = None
    for event in events:
        at, kind, node = float(event["at"]), str(event["kind"]), str(event.get("node") or "")
        times.append(at)
        if kind not in READ:
            continue
        fact = decode(kind, event.get("data") or {})
        _cluster_event(timeline, states, fact, at, node)
        if event.get("job") == job:
            last_checkpoint = _job_event(timeline, fact, at, global_batch, last_checkpoint)
    if times:
        timeline.start, timeline.end = min(times), max(times)
    return timeline


# The kinds a timeline draws (the others are not decoded).
READ = frozenset(
    {
        EventKind.NODE_REGISTERED,
        EventKind.NODE_STATE_CHANGED,
        EventKind.EVICTION_NOTICED,
        EventKind.GENERATION_ISSUED,
        EventKind.CHECKPOINT_COMMITTED,
        EventKind.EVALUATION_COMPLETED,
        EventKind.TRAINING_PROGRESSED,
        EventKind.CHECKPOINT_STALL_MEASURED,
        EventKind.TRAINING_RESUMED,
    }
)


def _cluster_event(timeline: Timeline, states: dict[str, str], fact: Fact, at: float, node: str) -> None:
    """A node's arrival, state change or eviction notice: the marks, and the count of nodes available."""
    if isinstance(fact, facts.NodeRegistered):
        states[node] = "JOINING"
        timeline.marks.append((at, "arrival", node))
    elif isinstance(fact, facts.NodeStateChanged) and node:
        states[node] = fact.target
        if fact.target in ("LOST", "GONE") and fact.source in LIVE:
            timeline.marks.append((at, "loss", node))
    else:
        if isinstance(fact, facts.EvictionNoticed):
            timeline.marks.append((at, "eviction", node))
        return
    count = sum(1 for state in states.values() if state in LIVE)
    if timeline.nodes and timeline.nodes[-1][0] == at:
        timeline.nodes[-1] = (at, count)
    elif not timeline.nodes or timeline.nodes[-1][1] != count:
        timeline.nodes.append((at, count))


def _job_event(
    timeline: Timeline, fact: Fact, at: float, global_batch: int, last: tuple[float, int] | None
) -> tuple[float, int] | None:
    """One event of the job drawn; returns the newest (time, step) samples/s are measured from."""
    if isinstance(fact, facts.GenerationIssued):
        timeline.generations.append(Generation(fact.generation, at, fact.layout, fact.cause))
        return at, fact.resume_step
    if isinstance(fact, facts.CheckpointCommitted):
        timeline.checkpoints.append((at, fact.step))
        if last is not None and at > last[0] and fact.step > last[1]:
            rate = (fact.step - last[1]) * global_batch / (at - last[0])
            timeline.throughput.append((last[0], at, rate))
        return at, fact.step
    if isinstance(fact, facts.EvaluationCompleted):
        timeline.evaluations.append((at, fact.step, fact.loss))
    elif isinstance(fact, facts.TrainingProgressed) and fact.loss is not None:
        timeline.training.append((at, fact.step, fact.loss))
    elif isinstance(fact, facts.CheckpointStallMeasured):  # a later (longer) measurement of the same one replaces it
        timeline.stalls[fact.step] = fact.stall_seconds
    elif isinstance(fact, facts.TrainingResumed):
        timeline.pauses.append(
            Pause(
                fact.generation,
                fact.paused_since,
                fact.resumed_at,
                fact.pause_seconds,
                fact.decision_seconds,
                fact.stalled_seconds,
            )
        )
    return last


def render_html(timeline: Timeline, title: str) -> str:
    span = max(timeline.end - timeline.start, 1e-9)

    def x(at: float) -> float:
        return MARGIN + (at - timeline.start) / span * (WIDTH - 2 * MARGIN)

    panels = [
        _panel("nodes available", _nodes(timeline, x), 0),
        _panel("samples/s (between checkpoints)", _throughput(timeline, x), 1),
        _panel("generations (P x D); grey: training paused by a morph", _generations(timeline, x), 2),
        _panel("loss: training (blue), eval (purple)", _losses(timeline, x), 3),
    ]
    axis = _axis(timeline, x, 4 * PANEL)
    body = "\n".join(panels) + axis
    height = 4 * PANEL + 40
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:16px} text{font-size:11px}</style></head><body>"
        f"<h2>{html.escape(title)}</h2>"
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' role='img'>{body}</svg>"
        "<p>Markers: <span style='color:#c0392b'>&#9660; eviction notice</span>, "
        "<span style='color:#7f1d1d'>&#10006; node lost or gone</span>, "
        "<span style='color:#1e8449'>&#9650; node arrived</span>, | checkpoint.</p>"
        "</body></html>\n"
    )


def _panel(label: str, content: str, index: int) -> str:
    top = index * PANEL
    return (
        f"<g transform='translate(0,{top})'><rect x='{MARGIN}' y='10' width='{WIDTH - 2 * MARGIN}' "
        f"height='{PANEL - 30}' fill='#fafafa' stroke='#ddd'/><text x='{MARGIN}' y='8'>{html.escape(label)}</text>"
        f"{content}</g>"
    )


def _scale(value: float, top: float) -> float:
    return 10 + (PANEL - 30) * (1 - value / top) if top > 0 else PANEL - 20


def _nodes(timeline: Timeline, x: Any) -> str:
    if not timeline.nodes:
        return ""
    top = max(n for _, n in timeline.nodes) or 1
    points = []
    for (at, count), (following, _) in zip(timeline.nodes, [*timeline.nodes[1:], (timeline.end, 0)], strict=True):
        points += [f"{x(at):.1f},{_scale(count, top):.1f}", f"{x(following):.1f},{_scale(count, top):.1f}"]
    parts = [f"<polyline fill='none' stroke='#2c3e50' stroke-width='2' points='{' '.join(points)}'/>"]
    parts.append(f"<text x='{MARGIN - 6}' y='{_scale(top, top) + 4:.1f}' text-anchor='end'>{top}</text>")
    glyphs = {"eviction": ("&#9660;", "#c0392b"), "loss": ("&#10006;", "#7f1d1d"), "arrival": ("&#9650;", "#1e8449")}
    for at, kind, node in timeline.marks:
        glyph, colour = glyphs[kind]
        parts.append(
            f"<text x='{x(at):.1f}' y='{PANEL - 22}' fill='{colour}' text-anchor='middle'>"
            f"<title>{html.escape(kind)} {html.escape(node)}</title>{glyph}</text>"
        )
    return "".join(parts)


def _throughput(timeline: Timeline, x: Any) -> str:
    top = max((rate for _, _, rate in timeline.throughput), default=0.0)
    parts = []
    for start, end, rate in timeline.throughput:
        y = _scale(rate, top)
        parts.append(
            f"<rect x='{x(start):.1f}' y='{y:.1f}' width='{max(x(end) - x(start), 1):.1f}' "
            f"height='{PANEL - 20 - y:.1f}' fill='#5dade2'><title>{rate:.1f} samples/s</title></rect>"
        )
    for at, step in timeline.checkpoints:
        stall = timeline.stalls.get(step)
        paused = "" if stall is None else f", training paused {stall * 1e3:.1f} ms for it"
        parts.append(
            f"<line x1='{x(at):.1f}' x2='{x(at):.1f}' y1='{PANEL - 24}' y2='{PANEL - 16}' stroke='#555'>"
            f"<title>checkpoint at step {step}{paused}</title></line>"
        )
    if top:
        parts.append(f"<text x='{MARGIN - 6}' y='14' text-anchor='end'>{top:.0f}</text>")
    return "".join(parts)


def _generations(timeline: Timeline, x: Any) -> str:
    colours = ("#f5b041", "#58d68d", "#af7ac5", "#5dade2", "#ec7063", "#48c9b0")
    parts = []
    bands: Sequence[Generation] = timeline.generations
    for generation, following in zip(bands, [*bands[1:], None], strict=False):
        end = following.start if following else timeline.end
        left, width = x(generation.start), max(x(end) - x(generation.start), 1)
        colour = colours[generation.number % len(colours)]
        label = f"g{generation.number} {generation.layout.split(' (')[0]}"
        parts.append(
            f"<rect x='{left:.1f}' y='30' width='{width:.1f}' height='60' fill='{colour}' opacity='0.7'>"
            f"<title>generation {generation.number}: {html.escape(generation.layout)} "
            f"({html.escape(generation.cause)})</title></rect>"
            f"<text x='{left + 3:.1f}' y='64'>{html.escape(label)}</text>"
        )
    for pause in timeline.pauses:
        left, width = x(pause.start), max(x(pause.end) - x(pause.start), 1)
        decided = "" if pause.decision_seconds is None else f", decided in {pause.decision_seconds:.1f} s"
        if pause.stalled_seconds is not None:
            decided = f" ({pause.stalled_seconds:.1f} s stalled, then the first step){decided}"
        parts.append(
            f"<rect x='{left:.1f}' y='92' width='{width:.1f}' height='12' fill='#7f8c8d' opacity='0.9'>"
            f"<title>training paused {pause.seconds:.1f} s before generation {pause.generation}{decided}</title></rect>"
        )
    return "".join(parts)


def _losses(timeline: Timeline, x: Any) -> str:
    series = [(timeline.training, "#2e86c1", "loss"), (timeline.evaluations, "#8e44ad", "eval loss")]
    losses = [loss for points, _, _ in series for _, _, loss in points]
    if not losses:
        return f"<text x='{MARGIN + 6}' y='40'>no loss reported yet (no step, and no evaluation)</text>"
    low, high = min(losses), max(losses)
    spread = (high - low) or max(abs(high), 1.0)

    def y(loss: float) -> float:
        return 10 + (PANEL - 30) * (0.9 - 0.8 * (loss - low) / spread)

    parts = []
    for points, colour, what in series:
        line = " ".join(f"{x(at):.1f},{y(loss):.1f}" for at, _, loss in points)
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='2' points='{line}'/>" if line else "")
        for at, step, loss in points:
            parts.append(
                f"<circle cx='{x(at):.1f}' cy='{y(loss):.1f}' r='3' fill='{colour}'>"
                f"<title>{what} {loss:.4f} at step {step}</title></circle>"
            )
    parts.append(f"<text x='{MARGIN - 6}' y='{y(high) + 4:.1f}' text-anchor='end'>{high:.3g}</text>")
    parts.append(f"<text x='{MARGIN - 6}' y='{y(low) + 4:.1f}' text-anchor='end'>{low:.3g}</text>")
    return "".join(parts)


def _axis(timeline: Timeline, x: Any, top: float) -> str:
    span = timeline.end - timeline.start
    ticks = []
    for i in range(6):
        at = timeline.start + span * i / 5
        ticks.append(f"<text x='{x(at):.1f}' y='{top + 14}' text-anchor='middle'>{at - timeline.start:.0f}s</text>")
    return "".join(ticks)
