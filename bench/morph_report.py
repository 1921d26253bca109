"""The morph benchmark's section of docs/benchmarks.md, from its recoveries (:mod:`bench.morph_bench`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.morph_measure import PHASES, Recovery
from morphing.words import plural

HEADING = "## Morph latency on the local cluster"
COMMAND = "MORPH_BENCH_REPS=3 .venv/bin/python -m bench.morph_bench"
LABELS = {
    "notice": "eviction with notice, warm",
    "jit": "kill, just-in-time checkpoint, warm",
    "stage": "kill of a whole stage, warm",
    "restart": "kill, full restart, cold",
}


@dataclass(frozen=True)
class Setup:
    machine: str
    load: tuple[float, float]  # 1-minute load average before and after
    floor: tuple[float, float]  # concurrent torch imports, gloo set-up
    floor_repeats: int
    reps: int
    nodes: int
    notice: float
    expiry: float  # heartbeat expiry
    steps: tuple[int, int]  # steps, checkpoint interval of the kill jobs
    stage_steps: tuple[int, int]
    kill_offsets: tuple[int, ...]  # where the kills were aimed: steps past a periodic checkpoint
    stage_kill_offsets: tuple[int, ...]
    batch: int


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 else "no ratio (none)"


def goals(notice: list[Recovery], jit: list[Recovery]) -> str:
    """The issue's acceptance figures, measured against their goals in this run."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lost = max(r.steps_lost for r in jit)
    worst = max(r.max_rel or 0.0 for r in jit)
    first = median([r.total for r in jit])
    warned = median([r.total for r in notice])
    return (
        f"Against the goals (issue 16), in this run: kill without notice with D >= 2, steps lost at most {lost} "
        f"(goal <= 1: {verdict(lost <= 1)}), final parameters within {worst:.1e} of the reference (goal <= 1e-9: "
        f"{verdict(worst <= 1e-9)}), median kill -> first step {first:.3f} s (goal <= 3 s: {verdict(first <= 3)}); "
        f"eviction with notice, median notice -> first step {warned:.3f} s (goal <= 1 s: {verdict(warned <= 1)})."
    )


def phase_table(recoveries: list[Recovery]) -> list[str]:
    rows = ["| phase | median (s) | max (s) |", "|---|---|---|"]
    for name in PHASES:
        values = [r.phases()[name] for r in recoveries if name in r.phases()]
        if len(values) == len(recoveries):
            rows.append(f"| {name} | {median(values):.2f} | {max(values):.2f} |")
    totals = [r.total for r in recoveries]
    rows.append(f"| **loss -> first step** | **{median(totals):.2f}** | **{max(totals):.2f}** |")
    return rows


def summary_row(label: str, rs: list[Recovery], lost: str, fidelity: str) -> str:
    totals = [r.total for r in rs]
    back = f"{median([r.back for r in rs]):.2f}" if rs[0].back_at else "= first step"
    reasons = ", ".join(sorted({r.reason for r in rs})) or "(planned stop)"
    return (
        f"| {label} | {len(rs)} | **{median(totals):.2f}** | {max(totals):.2f} | {lost} | {back} | {fidelity} "
        f"| {reasons} |"
    )


def kills_table(kills: list[Recovery]) -> list[str]:
    rows = [
        "| case | VMs killed | step reached | resumed from | steps re-computed | kill -> first step (s) "
        "| kill -> back at the step reached (s) | final vs reference (max rel) | SalvageEnded |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in kills:
        rows.append(
            f"| {LABELS[r.path]} | {', '.join(r.nodes)} | {r.reached} | {r.resumed} | {r.steps_lost} "
            f"| {r.total:.2f} | {r.back:.2f} | {r.max_rel:.1e} | {r.reason} |"
        )
    return rows


def section(
    s: Setup,
    notice: list[Recovery],
    notice_lost: int,
    jit: list[Recovery],
    stage: list[Recovery],
    restart: list[Recovery],
) -> str:
    """The report: how it was measured, the results against each other, then the floor and the phases."""
    return "\n".join(
        [
            *_method(s),
            *_results(notice, notice_lost, jit, stage, restart),
            *_floor(s),
            *_phases(notice, jit, stage, restart),
        ]
    )


def _method(s: Setup) -> list[str]:
    """The machine, the clusters and the cases."""
    steps, interval = s.steps
    stage_steps, stage_interval = s.stage_steps
    return [
        HEADING,
        "",
        f"`{COMMAND}` on {s.machine}: a short run, {plural(s.reps, 'repetition')} of each case, all in one "
        f"run on one machine. The figures are **noisy**: its cores were shared with other work (1-minute load "
        f"average {s.load[0]:.1f} before and {s.load[1]:.1f} after the run), and every trainer, agent and the "
        "controller time-share them; take these medians as indications, not as the product's latency on "
        "real VMs.",
        "",
        f"Local clusters of {s.nodes} VMs x 1 slot, the demo model in float64 (B={s.batch}); VMs killed with "
        f"`local kill` (SIGKILL of the VM's whole session: agent and trainers, no notice); heartbeat expiry "
        f"{s.expiry:.0f} s, which no recovery waits for. Warm trainers are the "
        "default: every agent keeps one trainer process per slot that has imported torch and waits for an "
        "assignment. The cases (details in `bench/morph_bench.py`):",
        "",
        f"- **eviction with notice, warm**: one long job at 1x{s.nodes}; a node it uses gets a {s.notice:.0f} s "
        "Scheduled Events notice; after each round a VM is added and the job grows back;",
        f"- **kill, just-in-time checkpoint, warm**: a fresh {steps}-step job per repetition, 1x{s.nodes} "
        f"(D = {s.nodes}), a checkpoint every {interval} steps, one VM killed {'/'.join(map(str, s.kill_offsets))} "
        "steps past a periodic checkpoint (one kill per job, evenly inside an interval; the first checkpoint "
        "once every agent's warm trainer is ready again, as replacing them competes with the job); the survivors "
        "write the step they hold (one writer per stage), the next generation resumes from it;",
        f"- **kill of a whole stage, warm**: the demo model with a profile that forces a pipeline (compute-bound "
        f"and short of memory: `spotmorph.local.unplanned.pipeline_profile`), 2x2; both VMs of stage 1 killed "
        f"together; a {stage_steps}-step job with a checkpoint every {stage_interval} steps (a 2x2 pipeline "
        f"steps several times slower here), killed {'/'.join(map(str, s.stage_kill_offsets))} steps past one;",
        "- **kill, full restart, cold** (the torchrun-style baseline): the same jobs and kill points as the "
        "just-in-time case on a second cluster with `SPOTMORPH_WARM_TRAINERS=0` (every trainer a fresh "
        "process) and just-in-time checkpoints disabled (`SPOTMORPH_CONTROLLER_SALVAGE_WRITE_SECONDS=0.001`: "
        "the salvage order reaches the writers past its deadline, they refuse it, the controller falls back "
        "to the newest periodic checkpoint); detection is the same as in the just-in-time case (the survivors' "
        "failed collective), so the difference is what the restart itself costs.",
        "",
        "Every job that was killed ran to its end, and its final checkpoint was compared with an uninterrupted "
        "1-process float64 run of as many steps (`spotmorph checkpoint diff`, max relative error over every "
        "parameter and optimizer-state tensor).",
        "",
    ]


def _results(
    notice: list[Recovery], notice_lost: int, jit: list[Recovery], stage: list[Recovery], restart: list[Recovery]
) -> list[str]:
    """The summary table and the full restart against the just-in-time path."""

    def lost(rs: list[Recovery]) -> str:
        values = [r.steps_lost for r in rs]
        return f"{median(values):.0f} (max {max(values)})"

    def fidelity(rs: list[Recovery]) -> str:
        return f"{max(r.max_rel or 0.0 for r in rs):.1e}"

    first = (median([r.total for r in restart]), median([r.total for r in jit]))
    back = (median([r.back for r in restart]), median([r.back for r in jit]))
    redo = (median([r.steps_lost for r in restart]), median([r.steps_lost for r in jit]))
    return [
        "| case | runs | median loss -> first step (s) | max (s) | steps re-computed, median | "
        "median loss -> back at the step reached (s) | final vs reference, worst | SalvageEnded |",
        "|---|---|---|---|---|---|---|---|",
        summary_row(LABELS["notice"], notice, f"0 (job: {notice_lost} lost)", "(not compared)"),
        summary_row(LABELS["jit"], jit, lost(jit), fidelity(jit)),
        summary_row(LABELS["stage"], stage, lost(stage), fidelity(stage)),
        summary_row(LABELS["restart"], restart, lost(restart), fidelity(restart)),
        "",
        "The full restart against the just-in-time path, same kills, medians: "
        f"kill -> first step **{ratio(*first)}** ({first[0]:.2f} s against {first[1]:.2f} s); kill -> back at "
        f"the step it had reached **{ratio(*back)}** ({back[0]:.2f} s against {back[1]:.2f} s); steps "
        f"re-computed {redo[0]:.0f} against {redo[1]:.0f}, {ratio(*redo)}; counting on both sides the step "
        "in flight, which every path abandons, steps computed again or lost "
        f"**{ratio(redo[0] + 1, redo[1] + 1)}** ({redo[0] + 1:.0f} against {redo[1] + 1:.0f}).",
        "",
        goals(notice, jit),
        "",
    ]


def _floor(s: Setup) -> list[str]:
    """What any cold restart pays at least, measured right before the cold restarts."""
    imports, groups = s.floor
    return [
        f"Floor, measured right before the cold restarts (median of {s.floor_repeats}): {s.nodes} processes "
        f"importing torch at once **{imports:.2f} s**, a {s.nodes}-process gloo process-group set-up on loopback "
        f"once they are all up **{groups:.2f} s**; a cold restart's processes do at least that, "
        f"**{imports + groups:.2f} s** under the load of that moment (it varies: compare the cold `process "
        "start` phase below).",
        "",
    ]


def _phases(notice: list[Recovery], jit: list[Recovery], stage: list[Recovery], restart: list[Recovery]) -> list[str]:
    """Each case's phases, then every kill."""
    return [
        "Phases: milestones are the latest over the ranks concerned, from the trainers' progress lines and the "
        "controller's events, so they add up to the total (`detect`: until the controller has a survivor's "
        "`CollectiveFailed`; `suspect`: the grace (`suspect_grace_seconds`, 1.5 s) after which the silent VMs "
        "are taken for lost; `salvage`: the just-in-time write and commit, or the decision to fall back; `plan`: "
        "the old trainers exit and the next generation is issued; `deliver`: until the agents hand the "
        "assignment to a process; `process start`: until it has imported torch and built its stages).",
        "",
        f"Eviction with notice, warm ({plural(len(notice), 'morph')}):",
        "",
        *phase_table(notice),
        "",
        f"Kill, just-in-time checkpoint, warm ({plural(len(jit), 'kill')}):",
        "",
        *phase_table(jit),
        "",
        f"Kill of a whole stage, warm ({plural(len(stage), 'kill')}):",
        "",
        *phase_table(stage),
        "",
        f"Kill, full restart, cold ({plural(len(restart), 'kill')}):",
        "",
        *phase_table(restart),
        "",
        "Every kill:",
        "",
        *kills_table([*jit, *restart, *stage]),
    ]
