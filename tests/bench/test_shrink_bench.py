"""The shrink bench's job can be shrunk: on its profile, 1 VM fits nothing, 2 fit a pipeline and 3 run faster (with
less memory a VM, 2 VMs fit nothing either and the scheduler has nothing to shrink it to: the bench then waits in
vain for a shrink)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common import ROOT
from bench.shrink_bench import STAGE_MEMORY
from morphing.planner import Planner
from morphing.profile import parse_profile
from scheduler.jobs import throughput_curve
from spotmorph.local.unplanned import pipeline_profile


@pytest.mark.parametrize("size", sorted(STAGE_MEMORY))
def test_the_low_priority_job_fits_two_or_three_vms_never_one(tmp_path: Path, size: str) -> None:
    base = ROOT / "bench" / "profiles" / f"gpt2_{size}.json"
    profile = pipeline_profile(tmp_path / "profile.json", STAGE_MEMORY[size], base)
    _, one, two, three = throughput_curve(Planner(parse_profile(profile.read_text()), 4), 3, 1)
    assert one == 0.0 and 0.0 < two < three, (one, two, three)
