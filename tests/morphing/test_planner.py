from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphing.errors import UserInputError
from morphing.layout import local_nodes
from morphing.planner import Infeasible, Plan, Planner, throughput
from morphing.profile import Profile, parse_profile
from morphing.stages import GIB

from .strategies import profiles, schedules

ROOT = Path(__file__).resolve().parents[2]
GPT48 = parse_profile((ROOT / "examples" / "profiles" / "gpt48.json").read_text())


@settings(max_examples=60, deadline=None)
@given(profiles(max_layers=6), st.integers(1, 48), st.integers(1, 12), st.integers(1, 4), st.data())
def test_planner_is_optimal_within_its_model(
    profile: Profile, batch: int, gpus: int, per_node: int, data: st.DataObject
) -> None:
    planner = Planner(profile, batch, data.draw(schedules))
    result = planner.plan_gpus(gpus, per_node)
    best = planner.best_by_exhaustion(local_nodes(gpus, per_node))
    if best == 0.0:
        assert isinstance(result, Infeasible)
        assert result.reason.startswith("memory")
    else:
        assert isinstance(result, Plan)
        assert result.samples_per_second == pytest.approx(best, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(profiles(max_layers=8), st.integers(1, 64), st.integers(2, 24), st.integers(1, 4))
def test_throughput_never_falls_as_gpus_are_added(profile: Profile, batch: int, max_gpus: int, per_node: int) -> None:
    planner = Planner(profile, batch)
    table = planner.what_if(max_gpus, per_node)
    rates = [throughput(r) for r in table]
    assert all(later >= earlier for earlier, later in itertools.pairwise(rates))
    fresh = Planner(profile, batch)
    for gpus, result in enumerate(table, start=1):
        alone = fresh.plan_gpus(gpus, per_node)
        assert throughput(alone) == pytest.approx(throughput(result), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(profiles(max_layers=8, memory_gib=(0.2, 8.0)), st.integers(1, 64), st.integers(1, 16), st.data())
def test_returned_plans_fit_in_memory_and_keep_the_batch(
    profile: Profile, batch: int, gpus: int, data: st.DataObject
) -> None:
    schedule = data.draw(schedules)
    result = Planner(profile, batch, schedule).plan_gpus(gpus, data.draw(st.integers(1, 4)))
    if isinstance(result, Plan):
        assert max(m.total for m in result.stage_memory) <= profile.cluster.gpu_memory_bytes + 8
        assert sum(result.layout.samples_per_replica) == batch
        assert result.gpus_used <= gpus
        covered = [i for a, b in result.layout.stage_layers for i in range(a, b)]
        assert covered == list(range(len(profile.layers)))
        assert result.samples_per_second == pytest.approx(batch / result.predicted_step_seconds)


def test_gpt48_needs_seven_stages_and_says_so() -> None:
    planner = Planner(GPT48, 512)
    too_few = planner.plan_gpus(6, 8)
    assert isinstance(too_few, Infeasible)
    assert "at least 7 stages" in too_few.reason
    assert "--gpus >= 7" in too_few.reason
    enough = planner.plan_gpus(7, 8)
    assert isinstance(enough, Plan)
    assert enough.layout.pipeline_stages == 7
    assert any("P < 7 rejected: memory" in note for note in enough.notes)


def test_a_layer_too_big_for_any_gpu_is_named() -> None:
    result = Planner(GPT48, 8, gpu_memory_bytes=GIB).plan_gpus(64, 8)
    assert isinstance(result, Infeasible)
    assert "even one layer per stage does not fit" in result.reason


def test_pipeline_stays_inside_a_node_when_it_can() -> None:
    result = Planner(GPT48, 512).plan_gpus(16, 8)
    assert isinstance(result, Plan)
    layout = result.layout
    if layout.pipeline_stages <= 8 and 8 % layout.pipeline_stages == 0:
        for d in range(layout.data_parallel):
            assert len({layout.placement[layout.rank(d, s)].node for s in range(layout.pipeline_stages)}) == 1


def test_plan_dict_has_the_documented_fields() -> None:
    result = Planner(GPT48, 100).plan_gpus(24, 8)
    data = result.to_dict()
    for key in (
        "gpus",
        "gpus_used",
        "pipeline_stages",
        "data_parallel",
        "micro_batch_size",
        "samples_per_replica",
        "micro_batches_per_replica",
        "stage_layers",
        "predicted_step_seconds",
        "samples_per_second",
    ):
        assert key in data
    assert sum(data["samples_per_replica"]) == 100
    assert len(data["stage_layers"]) == data["pipeline_stages"]
    json.dumps(data)


def test_planner_rejects_bad_numbers() -> None:
    with pytest.raises(UserInputError, match="global batch 0"):
        Planner(GPT48, 0)
    with pytest.raises(UserInputError, match="schedule"):
        Planner(GPT48, 8, "zigzag")  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="--gpus 0"):
        Planner(GPT48, 8).plan_gpus(0)


def test_batch_smaller_than_gpus_caps_replicas() -> None:
    result = Planner(GPT48, 3).plan_gpus(64, 8)
    assert isinstance(result, Plan)
    assert result.layout.data_parallel <= 3
    assert sum(result.layout.samples_per_replica) == 3


def test_a_gpu_floor_no_layout_reaches_is_named_as_the_reason() -> None:
    """With one sample a step there is one replica, so no layout uses more GPUs than the model has layers."""
    planner = Planner(GPT48, 1)
    nodes = local_nodes(64, 8)
    assert isinstance(planner.plan(nodes), Plan)
    refused = planner.plan(nodes, least_gpus=60)
    assert isinstance(refused, Infeasible)
    assert refused.reason == "no layout that fits uses 60 or more of the 64 GPUs", refused.reason
    assert isinstance(planner.plan(nodes, least_gpus=8), Plan)


def test_recomputation_fits_activation_heavy_models_on_fewer_gpus_and_predicts_a_slower_step() -> None:
    layer = {
        "forward_seconds": {"1": 0.01},
        "backward_seconds": {"1": 0.02},
        "output_activation_bytes_per_sample": 2**20,
        "parameter_bytes": 2**20,
        "activation_memory_bytes_per_sample": 2**28,
    }
    profile = Profile.model_validate(
        {
            "format": "spotmorph.profile/v1",
            "model": "activation-heavy",
            "layers": [{"name": f"l{i}", **layer} for i in range(8)],
            "cluster": {
                "gpu_memory_bytes": 2 * GIB,
                "intra_node_bandwidth_bytes_per_second": 1e10,
                "inter_node_bandwidth_bytes_per_second": 1e10,
                "allreduce_bandwidth_bytes_per_second": 1e10,
            },
        }
    )
    plain, recomputed = Planner(profile, 4), Planner(profile, 4, recomputation=True)
    assert plain.smallest_pipeline() == 2 and recomputed.smallest_pipeline() == 1
    assert isinstance(plain.plan_gpus(1), Infeasible)
    one = recomputed.plan_gpus(1)
    assert isinstance(one, Plan) and one.predicted_step_seconds == pytest.approx(4 * 8 * (0.01 + 0.02 + 0.01))


@settings(max_examples=30, deadline=None)
@given(profiles(), st.integers(1, 64), st.integers(1, 12), st.data())
def test_an_exact_jobs_planner_keeps_its_micro_batch_size_and_a_micro_batch_per_replica(
    profile: Profile, batch: int, gpus: int, data: st.DataObject
) -> None:
    """Exact mode's result depends on the micro-batch size: the planner never picks another one."""
    m = data.draw(st.sampled_from(profile.micro_batch_sizes))
    result = Planner(profile, batch, micro_batch_size=m).plan_gpus(gpus)
    if isinstance(result, Plan):
        assert result.layout.micro_batch_size == m
        assert result.layout.data_parallel <= -(-batch // m)  # unit_shares gives each replica a micro-batch


def test_an_exact_job_whose_micro_batch_size_was_not_profiled_is_told_to_profile_it() -> None:
    with pytest.raises(UserInputError, match=r"micro_batch_size 3 was not profiled .* profile it"):
        Planner(GPT48, 64, micro_batch_size=3)
