"""Rank 0's training lines: `spotmorph train` prints them, and under a controller they are the trainer's log."""

from __future__ import annotations

from worker_agent.contract.events import CheckpointWritten, EvaluationCompleted, StepCompleted, TrainingFinished
from worker_agent.runtime.link.training_log import TrainingLog


def step(n: int) -> StepCompleted:
    return StepCompleted(n, 2.0 / n, 0.5, 32.0, None)


def shown(log: TrainingLog, steps: list[tuple[int, float]]) -> list[str]:
    return [line for n, at in steps if (line := log.line(step(n), at)) is not None]


def test_every_interval_the_first_step_and_the_last_with_the_layout_and_the_time_left() -> None:
    # resumed at step 100 (its first step this generation at t=0), then 2 s a step, of 1,000 steps
    log = TrainingLog(10, 1000, "1x2 (P x D), m=4")
    lines = shown(log, [(101, 0.0), (105, 8.0), (110, 18.0), (120, 38.0), (1000, 1798.0)])
    assert len(lines) == 4, lines  # 105 is between intervals
    assert lines[0] == "step    101  loss 0.0198      32.0 samples/s  layout 1x2 (P x D), m=4"  # no pace yet
    assert lines[1].startswith("step    110  loss 0.0182") and lines[1].endswith("layout 1x2 (P x D), m=4  29m40s left")
    assert lines[2].endswith("  29m20s left")
    assert lines[3].endswith("samples/s  layout 1x2 (P x D), m=4")  # the last step: nothing left


def test_hours_are_said_in_hours_and_an_interval_of_0_prints_only_the_first_and_last() -> None:
    assert shown(TrainingLog(10, 10_000, "1x1"), [(1, 0.0), (10, 90.0)])[-1].endswith("  27h45m left")
    assert [line.split()[1] for line in shown(TrainingLog(0, 30, "1x1"), [(n, n) for n in range(1, 31)])] == ["1", "30"]


def test_evaluations_checkpoints_and_the_end_are_said() -> None:
    log = TrainingLog(10, 100, "2x1")
    assert log.line(EvaluationCompleted(40, 1.25, 0.5), 1.0) == "eval at step 40  loss 1.2500  (0.5 s)"
    assert log.line(CheckpointWritten(50, 50, 0.01), 2.0) == "checkpoint at step 50 (last checkpoint: step 50)"
    assert log.line(TrainingFinished(100, 100, 3.0, 0.1), 3.0) == "finished at step 100 (last checkpoint: step 100)"
