from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from morphing.profile import Profile
from morphing.stages import LayerCosts, in_flight

from .strategies import profiles, schedules


def _splits(layers: int, stages: int) -> list[tuple[tuple[int, int], ...]]:
    out = []
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        out.append(tuple(itertools.pairwise(bounds)))
    return out


@settings(max_examples=150, deadline=None)
@given(profiles(max_layers=7, memory_gib=(0.2, 40.0)), st.data())
def test_balanced_partition_is_the_best_split_that_fits(profile: Profile, data: st.DataObject) -> None:
    layers = len(profile.layers)
    stages = data.draw(st.integers(1, layers))
    m = data.draw(st.sampled_from(profile.micro_batch_sizes))
    schedule = data.draw(schedules)
    micro_batches = data.draw(st.integers(1, 12))
    costs = LayerCosts(profile, m)
    limit = float(profile.cluster.gpu_memory_bytes)

    def fits(split: tuple[tuple[int, int], ...]) -> bool:
        return all(
            costs.memory_total(a, b, in_flight(schedule, s, stages, micro_batches)) <= limit
            for s, (a, b) in enumerate(split)
        )

    feasible = [split for split in _splits(layers, stages) if fits(split)]
    found = costs.balanced_partition(stages, schedule, micro_batches, limit)
    if not feasible:
        assert found is None
        return
    assert found is not None
    assert len(found.stage_layers) == stages
    assert [i for a, b in found.stage_layers for i in range(a, b)] == list(range(layers))
    assert fits(found.stage_layers)
    best = min(max(costs.compute_seconds(a, b) for a, b in split) for split in feasible)
    assert abs(found.bottleneck_seconds - best) <= 1e-12 * max(1.0, best)


def test_partition_balances_time_not_layer_count() -> None:
    heavy_last = {
        "format": "spotmorph.profile/v1",
        "model": "skewed",
        "layers": [
            {
                "name": f"l{i}",
                "forward_seconds": {"1": 4.0 if i == 5 else 1.0},
                "backward_seconds": {"1": 8.0 if i == 5 else 2.0},
                "output_activation_bytes_per_sample": 0,
                "parameter_bytes": 0,
                "activation_memory_bytes_per_sample": 0,
            }
            for i in range(6)
        ],
        "cluster": {
            "gpu_memory_bytes": 1,
            "intra_node_bandwidth_bytes_per_second": 1.0,
            "inter_node_bandwidth_bytes_per_second": 1.0,
            "allreduce_bandwidth_bytes_per_second": 1.0,
        },
    }
    costs = LayerCosts(Profile.model_validate(heavy_last), 1)
    found = costs.balanced_partition(2, "1f1b", 4, 1.0)
    assert found is not None
    assert found.stage_layers == ((0, 5), (5, 6))
    assert found.bottleneck_seconds == 15.0
