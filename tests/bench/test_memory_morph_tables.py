"""The memory-morph bench's tables: idle time, each model over the smallest, the 4-VM cases' batches."""

from __future__ import annotations

import math

import pytest

from bench.memory_morph_report import (
    BATCH,
    CASES,
    WIDE_BATCH,
    Run,
    batch,
    by_size,
    median_runs,
    ratio,
    section,
    wide_batches,
)


def run(size: str, case: str, path: str, pause: float, step: float) -> Run:
    return Run(size, case, path, pause=pause, new_step_seconds=step)


def test_idle_is_the_pause_less_one_step_of_the_next_generation() -> None:
    assert run("4m", "growth", "memory", 0.6, 0.25).idle == pytest.approx(0.35)


def test_stalled_is_the_controllers_and_unknown_where_it_said_none() -> None:
    first = Run("43m", "growth", "memory", pause=6.0, new_step_seconds=5.0, stalled=0.5)
    assert first.stalled == 0.5 and first.idle == pytest.approx(1.0)
    assert math.isnan(run("43m", "growth", "memory", 6.0, 5.0).stalled)


def test_each_larger_model_is_compared_with_the_smallest_for_the_same_morph_and_path() -> None:
    runs = [
        run("4m", "growth", "memory", 0.5, 0.25),
        run("4m", "growth", "disk", 1.0, 0.5),
        run("43m", "growth", "memory", 2.0, 1.25),
        run("43m", "growth", "disk", 5.0, 1.5),
        run("43m", "kill", "memory", 4.0, 1.0),  # no 4M kill to compare with: no row
    ]
    lines = by_size(runs)
    assert "Over the 4M model's, same morph and path, same run:" in lines
    rows = [line for line in lines if line.startswith("| 43M")]
    assert rows == ["| 43M | growth | memory | 4.00 | 3.00 | nan |", "| 43M | growth | disk | 5.00 | 7.00 | nan |"]


def test_no_comparison_without_a_second_size_and_none_over_a_smaller_idle_of_zero() -> None:
    assert by_size([run("43m", "growth", "memory", 2.0, 1.0)]) == []
    lines = by_size([run("4m", "eviction", "disk", 0.5, 0.5), run("43m", "eviction", "disk", 2.0, 1.0)])
    assert math.isnan(float(lines[-1].split("|")[5]))
    small, large = (Run(s, "growth", "memory", pause=p, stalled=f) for s, p, f in [("4m", 1, 0.5), ("43m", 6, 1)])
    assert by_size([small, large])[-1] == "| 43M | growth | memory | 6.00 | 6.00 | 2.00 |"


def test_the_four_vm_cases_run_at_a_batch_every_vm_is_wanted_for_and_the_header_says_so() -> None:
    wide = [case for case, vms in CASES.items() if max(vms) > 2]
    assert wide and all(batch(size, case) == WIDE_BATCH[size] for size in WIDE_BATCH for case in wide)
    assert all(batch("43m", case) == BATCH for case in CASES if case not in wide)
    assert wide_batches([run("4m", "growth", "memory", 1, 1)]) == ""
    assert wide_batches([run("43m", "kill-4-3", "disk", 1, 1)]) == f" (43M {WIDE_BATCH['43m']} on 4 VMs)"


def test_memory_over_disk_is_left_out_where_the_disk_figure_is_about_zero() -> None:
    runs = [run("4m", "growth-3-4", "memory", 1.46, 0.57), run("4m", "growth-3-4", "disk", 1.54, 1.54)]
    assert ratio(runs, "4m", "growth-3-4", "pause") == "0.95"
    assert ratio(runs, "4m", "growth-3-4", "idle") == "-", "an idle of 0.00 s through the disk is no baseline"


def test_repeated_runs_give_one_row_each_the_run_with_the_median_idle() -> None:
    runs = [
        run("4m", "growth", "memory", 1.0, 0.5),  # idle 0.5
        run("4m", "growth", "disk", 3.0, 0.5),
        run("4m", "growth", "memory", 2.0, 0.5),  # idle 1.5
        run("4m", "growth", "disk", 4.0, 0.5),
        run("4m", "growth", "memory", 0.75, 0.5),  # idle 0.25
    ]
    rows = median_runs(runs)
    assert [(r.path, r.pause) for r in rows] == [("memory", 1.0), ("disk", 3.0)]  # the lower middle of two
    assert rows[0].idles == [0.25, 0.5, 1.5] and rows[1].idles == [2.5, 3.5]
    assert median_runs([runs[0]])[0].idles == [], "one run: nothing beside it"


def test_the_section_says_how_many_runs_and_shows_each_runs_idle() -> None:
    rows = median_runs([run("4m", "growth", "memory", p, 0.5) for p in (1.0, 2.0, 0.75)])
    text = section(rows, {"4m": (4_100_000, 49_000_000)}, "python -m bench.memory_morph_bench --repeat 3", (0, 0), 3)
    assert "3 runs of each row, interleaved, each row the run with the median idle" in text
    header = next(line for line in text.splitlines() if line.startswith("| model | params |"))
    row = next(line for line in text.splitlines() if line.startswith("| 4M | 4.1M |"))
    assert header.endswith("| idle of each run s |") and row.endswith("| 0.25, 0.50, 1.50 |")
    assert "| 0.50 |" in row and "one run, every row from it" not in text
    once = section(median_runs(rows[:1]), {"4m": (4_100_000, 49_000_000)}, "x", (0, 0))
    assert "one run, every row from it" in once and "idle of each run" not in once
