"""A trainer's steps under ``torch.profiler``, asked for in its environment: where a step's time goes and how
often the host waits for the device.

``SPOTMORPH_PROFILE_STEPS=A:B`` profiles steps A to B-1 (each with the step boundary before it);
``SPOTMORPH_PROFILE_DIR`` (default: the trainer's working directory) receives ``profile-rank{R}.txt``, the ops
by device time, and ``profile-rank{R}.json``, the counts below. A host wait is a CUDA runtime call that
blocks the CPU until the device catches up (``.item()``, ``.cpu()``, ``float(tensor)``, a synchronize): the
step loop's budget is one a step, the read of its loss. On a CPU there are none to count.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morphing.errors import UserInputError

STEPS_VAR = "SPOTMORPH_PROFILE_STEPS"
DIR_VAR = "SPOTMORPH_PROFILE_DIR"
# CUDA runtime calls that block the host until the device has done what came before.
STEP_RANGE = "spotmorph.step"  # the record_function range around each profiled step
HOST_WAITS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})


@dataclass(frozen=True)
class ProfileRequest:
    first: int  # the first step profiled
    end: int  # one past the last
    out: Path

    @property
    def steps(self) -> int:
        return self.end - self.first


def parse_request(env: Mapping[str, str]) -> ProfileRequest | None:
    """The profile ``env`` asks for, or None; a malformed value is the user's error, named with its fix."""
    raw = env.get(STEPS_VAR, "").strip()
    if not raw:
        return None
    first, sep, end = raw.partition(":")
    if not sep or not first.isdigit() or not end.isdigit() or not 0 < int(first) < int(end):
        raise UserInputError(
            f"{STEPS_VAR}={raw!r} is not A:B with 0 < A < B (steps A to B-1 are profiled); e.g. {STEPS_VAR}=5:8"
        )
    return ProfileRequest(int(first), int(end), Path(env.get(DIR_VAR) or "."))


def count_host_waits(names: list[str]) -> dict[str, int]:
    """How many of the profiled CPU-side events ``names`` were host waits, by call."""
    return dict(Counter(name for name in names if name in HOST_WAITS))


def within_steps(events: Any) -> list[str]:
    """The names of the CPU-side events that began inside a profiled step's range (the step boundary and the
    step): the profiler's own start and stop are outside them."""
    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == STEP_RANGE]
    return [e.name for e in events if any(lo <= e.time_range.start <= hi for lo, hi in ranges)]


class StepProfiler:
    """Starts ``torch.profiler`` before step ``first`` and writes its report after step ``end - 1``."""

    def __init__(self, request: ProfileRequest | None, rank: int, cuda: bool) -> None:
        self.request, self.rank, self.cuda = request, rank, cuda
        self._profile: Any = None
        self._range: Any = None

    def before(self, step: int) -> None:
        if self.request is None or not self.request.first <= step < self.request.end:
            return
        from torch import profiler

        if step == self.request.first:
            activities = [profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(profiler.ProfilerActivity.CUDA)
            self._profile = profiler.profile(activities=activities)
            self._profile.__enter__()
        self._range = profiler.record_function(STEP_RANGE)
        self._range.__enter__()

    def after(self, step: int) -> None:
        if self._profile is None or self.request is None:
            return
        self._range.__exit__(None, None, None)
        if step != self.request.end - 1:
            return
        if self.cuda:  # outside the steps' ranges, so neither this wait nor the profiler's own is counted
            import torch

            torch.cuda.synchronize()
        profile, self._profile = self._profile, None
        profile.__exit__(None, None, None)
        self._write(profile, self.request)

    def _write(self, profile: Any, request: ProfileRequest) -> None:
        request.out.mkdir(parents=True, exist_ok=True)
        sort = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        table = profile.key_averages().table(sort_by=sort, row_limit=40)
        (request.out / f"profile-rank{self.rank}.txt").write_text(table)
        waits = count_host_waits(within_steps(profile.events()))
        summary = {
            "steps": [request.first, request.end - 1],
            "host_waits": sum(waits.values()),
            "host_waits_per_step": sum(waits.values()) / request.steps,
            "host_waits_by_call": waits,
            "device": "cuda" if self.cuda else "cpu",
        }
        (request.out / f"profile-rank{self.rank}.json").write_text(json.dumps(summary, indent=1))
