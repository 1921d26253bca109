"""Pipeline-schedule simulator: the step time of one replica's pipeline plus the data-parallel all-reduce.

Each stage runs its operations in the order its schedule prescribes; an operation starts when the
stage is free and its input has arrived (the previous stage's forward plus the send time, or the
next stage's backward plus the send time). Sends are delays on the dependency edge, not stage time.
After its last backward a stage all-reduces its gradients with the other replicas; the step ends
when the slowest stage's all-reduce ends.

With uniform stages and no communication this reproduces the closed forms exactly: both GPipe and
1F1B take ``(M + P - 1) * (f + b)`` and idle ``(P - 1) / (M + P - 1)`` of the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from morphing.jobspec import SCHEDULES, Schedule


@dataclass(frozen=True)
class StageTiming:
    """Seconds per micro-batch for one stage; ``send`` is the hop to the next stage (0 for the last)."""

    forward: float
    backward: float
    send: float = 0.0
    allreduce: float = 0.0


@dataclass(frozen=True)
class SimResult:
    step_seconds: float
    pipeline_seconds: float
    bubble_fraction: float
    stage_finish: tuple[float, ...]


def op_order(schedule: Schedule, stage: int, stages: int, micro_batches: int) -> list[tuple[bool, int]]:
    """The ``(is_forward, micro_batch)`` sequence a stage executes in one step."""
    m = micro_batches
    if schedule == "gpipe":
        return [(True, i) for i in range(m)] + [(False, i) for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    warmup = min(stages - stage - 1, m)
    order = [(True, i) for i in range(warmup)]
    for j in range(m - warmup):
        order += [(True, warmup + j), (False, j)]
    order += [(False, m - warmup + j) for j in range(warmup)]
    return order


def simulate(stages: Sequence[StageTiming], micro_batches: int, schedule: Schedule) -> SimResult:
    """Simulated step of ``micro_batches`` micro-batches through ``stages`` under ``schedule``."""
    count = len(stages)
    if count == 0 or micro_batches <= 0:
        raise ValueError("need at least one stage and one micro-batch")
    finish = _pipeline_finish(stages, micro_batches, schedule)
    pipeline = max(finish)
    step = max(end + st.allreduce for end, st in zip(finish, stages, strict=True))
    busy = micro_batches * sum(st.forward + st.backward for st in stages)
    bubble = 1.0 - busy / (count * pipeline) if pipeline > 0 else 0.0
    return SimResult(step, pipeline, max(0.0, bubble), tuple(finish))


def _pipeline_finish(stages: Sequence[StageTiming], m: int, schedule: Schedule) -> list[float]:
    count = len(stages)
    orders = [op_order(schedule, s, count, m) for s in range(count)]
    fwd_end = [[-1.0] * m for _ in range(count)]
    bwd_end = [[-1.0] * m for _ in range(count)]
    pointer = [0] * count
    free = [0.0] * count
    remaining = sum(len(o) for o in orders)
    sweep = list(range(count))
    while remaining:
        progressed = False
        for s in sweep:
            order, st = orders[s], stages[s]
            ptr, now = pointer[s], free[s]
            while ptr < len(order):
                forward, i = order[ptr]
                if forward:
                    if s == 0:
                        ready = 0.0
                    else:
                        upstream = fwd_end[s - 1][i]
                        if upstream < 0:
                            break
                        ready = upstream + stages[s - 1].send
                    now = (now if now > ready else ready) + st.forward
                    fwd_end[s][i] = now
                else:
                    if s == count - 1:
                        ready = fwd_end[s][i]
                    else:
                        downstream = bwd_end[s + 1][i]
                        if downstream < 0:
                            break
                        ready = downstream + st.send
                    now = (now if now > ready else ready) + st.backward
                    bwd_end[s][i] = now
                ptr += 1
            if ptr != pointer[s]:
                remaining -= ptr - pointer[s]
                pointer[s], free[s] = ptr, now
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule} deadlocked; the op orders are inconsistent")
        sweep.reverse()
    return free


def closed_form_step(micro_batches: int, stages: int, forward: float, backward: float) -> float:
    """``(M + P - 1) * (f + b)``: uniform stages, no communication, GPipe or 1F1B."""
    return (micro_batches + stages - 1) * (forward + backward)


def closed_form_bubble(micro_batches: int, stages: int) -> float:
    return (stages - 1) / (micro_batches + stages - 1)
