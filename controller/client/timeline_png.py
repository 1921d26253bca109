"""The timeline as a PNG (matplotlib, Agg backend): the same four panels as the HTML page.

Kept apart from ``timeline`` so the HTML path needs no plotting library; matplotlib comes with the
``plot`` extra (``pip install 'spotmorph[plot]'``) and with the dev extra.
"""

from __future__ import annotations

from pathlib import Path

from controller.client.timeline import Timeline
from morphing.errors import UserInputError

MARKERS = {"eviction": ("v", "#c0392b"), "loss": ("X", "#7f1d1d"), "arrival": ("^", "#1e8449")}
COLOURS = ("#f5b041", "#58d68d", "#af7ac5", "#5dade2", "#ec7063", "#48c9b0")


def render_png(timeline: Timeline, title: str, out: Path) -> None:
    """Write the picture to ``out``; a missing matplotlib is the user's to fix, so it says how."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UserInputError(
            "a PNG timeline needs matplotlib: pip install 'spotmorph[plot]' (or write --out FILE.html)"
        ) from None

    start = timeline.start

    def t(at: float) -> float:
        return at - start

    end = t(timeline.end) if timeline.end > start else 1.0
    figure, (nodes, rate, bands, evals) = plt.subplots(4, 1, sharex=True, figsize=(10, 8.5), constrained_layout=True)
    figure.suptitle(title)
    if timeline.nodes:
        xs = [t(at) for at, _ in timeline.nodes] + [end]
        ys = [count for _, count in timeline.nodes]
        nodes.stairs(ys, xs, color="#2c3e50", linewidth=2, baseline=None)
    for kind, (marker, colour) in MARKERS.items():
        times = [t(a) for a, k, _ in timeline.marks if k == kind]
        if times:
            nodes.scatter(times, [0] * len(times), marker=marker, color=colour, label=kind, zorder=3, clip_on=False)
    nodes.set_ylabel("nodes available")
    nodes.set_ylim(bottom=-0.3)
    nodes.yaxis.set_major_locator(MaxNLocator(integer=True))
    if timeline.marks:
        nodes.legend(loc="upper right", fontsize="small")
    for begin, finish, samples in timeline.throughput:
        rate.fill_between([t(begin), t(finish)], [samples, samples], color="#5dade2", step="pre")
    for written, _ in timeline.checkpoints:
        rate.axvline(t(written), ymax=0.06, color="#555555", linewidth=1)
    rate.set_ylabel("samples/s")
    following = [g.start for g in timeline.generations[1:]] + [timeline.end] * bool(timeline.generations)
    for generation, until in zip(timeline.generations, following, strict=True):
        colour = COLOURS[generation.number % len(COLOURS)]
        bands.axvspan(t(generation.start), t(until), color=colour, alpha=0.7)
        label = f"g{generation.number} {generation.layout.split(' (')[0]}"
        bands.text(t(generation.start), 0.5, label, rotation=90, va="center", fontsize="small")
    for pause in timeline.pauses:
        bands.axvspan(t(pause.start), t(pause.end), ymin=0.0, ymax=0.12, color="#7f8c8d", alpha=0.9)
    bands.set_yticks([])
    bands.set_ylabel("generations (P x D)\ngrey: paused")
    if timeline.training:
        times, losses = [t(at) for at, _, _ in timeline.training], [loss for _, _, loss in timeline.training]
        evals.plot(times, losses, ".-", color="#2e86c1", label="training")
    if timeline.evaluations:
        times, losses = [t(at) for at, _, _ in timeline.evaluations], [loss for _, _, loss in timeline.evaluations]
        evals.plot(times, losses, "o-", color="#8e44ad", label="eval")
    if timeline.training or timeline.evaluations:
        evals.legend(loc="upper right", fontsize="small")
    evals.set_ylabel("loss")
    evals.set_xlabel("seconds since the first event")
    evals.set_xlim(0, end)
    try:
        figure.savefig(out, format="png", dpi=100)
    except OSError as exc:
        raise UserInputError(f"--out {out}: cannot write it ({exc.strerror})") from None
    finally:
        plt.close(figure)
