"""Hypothesis strategies for random but valid calibration profiles."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from morphing.jobspec import SCHEDULES, Schedule
from morphing.profile import Profile


@st.composite
def profiles(draw: st.DrawFn, max_layers: int = 8, memory_gib: tuple[float, float] = (0.5, 64.0)) -> Profile:
    sizes = draw(st.sampled_from([(1,), (1, 2), (1, 2, 4), (2, 4)]))
    count = draw(st.integers(1, max_layers))
    layers: list[dict[str, Any]] = []
    for i in range(count):
        per_sample = draw(st.floats(1e-4, 1e-1))
        efficiency = draw(st.floats(0.5, 1.0))
        layers.append(
            {
                "name": f"layer.{i}",
                "forward_seconds": {str(m): per_sample * m * (efficiency ** (m > 1)) for m in sizes},
                "backward_seconds": {str(m): 2 * per_sample * m * (efficiency ** (m > 1)) for m in sizes},
                "output_activation_bytes_per_sample": draw(st.integers(0, 2**24)),
                "parameter_bytes": draw(st.integers(0, 2**30)),
                "activation_memory_bytes_per_sample": draw(st.integers(0, 2**26)),
            }
        )
    intra = draw(st.floats(1e9, 2e11))
    return Profile.model_validate(
        {
            "format": "spotmorph.profile/v1",
            "model": "random",
            "layers": layers,
            "gradient_bytes_per_parameter_byte": 1.0,
            "optimizer_bytes_per_parameter_byte": draw(st.sampled_from([2.0, 6.0])),
            "cluster": {
                "gpu_memory_bytes": int(draw(st.floats(*memory_gib)) * 2**30),
                "intra_node_bandwidth_bytes_per_second": intra,
                "inter_node_bandwidth_bytes_per_second": intra / draw(st.floats(1.0, 50.0)),
                "allreduce_bandwidth_bytes_per_second": intra / draw(st.floats(1.0, 60.0)),
                "intra_node_latency_seconds": draw(st.floats(0, 1e-4)),
                "inter_node_latency_seconds": draw(st.floats(0, 1e-3)),
                "compute_slots_per_node": draw(st.one_of(st.none(), st.integers(1, 4))),
            },
        }
    )


schedules: st.SearchStrategy[Schedule] = st.sampled_from(SCHEDULES)
