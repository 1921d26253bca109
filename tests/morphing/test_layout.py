from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from morphing.errors import UserInputError
from morphing.layout import (
    InvalidLayout,
    Layout,
    Slot,
    contiguous_placement,
    default_micro_batch_size,
    even_partition,
    local_nodes,
    make_layout,
    split_evenly,
)


@st.composite
def layout_requests(draw: st.DrawFn) -> tuple[int, int, int, int, int]:
    layers = draw(st.integers(1, 60))
    stages = draw(st.integers(1, layers))
    batch = draw(st.integers(1, 300))
    replicas = draw(st.integers(1, batch))
    micro = draw(st.integers(1, 16))
    return layers, stages, replicas, micro, batch


@given(layout_requests())
def test_samples_per_replica_sum_to_the_global_batch_for_every_d(req: tuple[int, int, int, int, int]) -> None:
    layers, stages, replicas, micro, batch = req
    layout = make_layout(
        num_layers=layers, pipeline_stages=stages, data_parallel=replicas, micro_batch_size=micro, global_batch=batch
    )
    counts = layout.samples_per_replica
    assert sum(counts) == batch
    assert len(counts) == replicas
    assert max(counts) - min(counts) <= 1
    assert min(counts) >= 1
    for n, mbs in zip(counts, layout.micro_batches_per_replica, strict=True):
        assert (mbs - 1) * micro < n <= mbs * micro


@given(layout_requests())
def test_replica_slices_tile_the_batch_in_order(req: tuple[int, int, int, int, int]) -> None:
    layers, stages, replicas, micro, batch = req
    layout = make_layout(
        num_layers=layers, pipeline_stages=stages, data_parallel=replicas, micro_batch_size=micro, global_batch=batch
    )
    covered = [i for d in range(replicas) for i in range(*layout.replica_slice(d))]
    assert covered == list(range(batch))


@given(st.integers(1, 80), st.data())
def test_even_partition_covers_each_layer_once(layers: int, data: st.DataObject) -> None:
    stages = data.draw(st.integers(1, layers))
    ranges = even_partition(layers, stages)
    assert len(ranges) == stages
    assert [i for a, b in ranges for i in range(a, b)] == list(range(layers))
    assert all(b > a for a, b in ranges)


@given(layout_requests())
def test_rank_coords_roundtrip_and_dict_roundtrip(req: tuple[int, int, int, int, int]) -> None:
    layers, stages, replicas, micro, batch = req
    layout = make_layout(
        num_layers=layers, pipeline_stages=stages, data_parallel=replicas, micro_batch_size=micro, global_batch=batch
    )
    for rank in range(layout.world_size):
        assert layout.rank(*layout.coords(rank)) == rank
    assert Layout.from_dict(layout.to_dict()) == layout


def test_d_greater_than_b_gets_a_reason() -> None:
    with pytest.raises(InvalidLayout, match=r"data_parallel=5 > global_batch=4.*at most 4"):
        make_layout(num_layers=4, pipeline_stages=1, data_parallel=5, micro_batch_size=1, global_batch=4)


def test_p_greater_than_layers_gets_a_reason() -> None:
    with pytest.raises(InvalidLayout, match=r"pipeline_stages=5 > layers=3.*at most 3"):
        make_layout(num_layers=3, pipeline_stages=5, data_parallel=1, micro_batch_size=1, global_batch=4)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("global_batch", {"global_batch": 0}),
        ("data_parallel", {"data_parallel": 0}),
        ("micro_batch_size", {"micro_batch_size": 0}),
        ("pipeline_stages", {"pipeline_stages": 0}),
    ],
)
def test_non_positive_numbers_are_named(field: str, kwargs: dict[str, int]) -> None:
    request = {"pipeline_stages": 2, "data_parallel": 2, "micro_batch_size": 1, "global_batch": 8, **kwargs}
    with pytest.raises(UserInputError, match=field):
        make_layout(
            num_layers=4,
            pipeline_stages=request["pipeline_stages"],
            data_parallel=request["data_parallel"],
            micro_batch_size=request["micro_batch_size"],
            global_batch=request["global_batch"],
        )


def test_placement_fills_nodes_in_order_and_keeps_replicas_together() -> None:
    layout = make_layout(
        num_layers=8,
        pipeline_stages=2,
        data_parallel=3,
        micro_batch_size=1,
        global_batch=6,
        nodes=local_nodes(6, 2),
    )
    for replica in range(3):
        first, second = layout.placement[layout.rank(replica, 0)], layout.placement[layout.rank(replica, 1)]
        assert first.node == second.node
    assert layout.nodes() == ("node-1", "node-2", "node-3")


def test_placement_rejects_too_few_slots_and_duplicates() -> None:
    with pytest.raises(InvalidLayout, match="needs 5 slots"):
        contiguous_placement(5, [("a", 2), ("b", 2)])
    with pytest.raises(InvalidLayout, match="twice"):
        Layout(1, 2, 1, 2, ((0, 1),), (Slot("a", 0), Slot("a", 0)))


def test_non_contiguous_stage_layers_are_rejected() -> None:
    with pytest.raises(InvalidLayout, match="contiguous"):
        Layout(2, 1, 1, 2, ((0, 2), (3, 4)), (Slot("a", 0), Slot("a", 1)))


def test_split_evenly_puts_larger_parts_first() -> None:
    assert split_evenly(10, 4) == (3, 3, 2, 2)
    assert split_evenly(3, 3) == (1, 1, 1)


def test_local_nodes_last_node_partial() -> None:
    assert local_nodes(10, 4) == (("node-1", 4), ("node-2", 4), ("node-3", 2))


@given(st.integers(1, 10_000), st.integers(1, 64), st.integers(1, 64))
def test_the_default_micro_batch_splits_a_replica_only_to_fill_a_pipeline(
    batch: int, stages: int, replicas: int
) -> None:
    replicas = min(replicas, batch)
    micro = default_micro_batch_size(batch, stages, replicas)
    share = -(-batch // replicas)
    if stages == 1:
        assert micro == share  # one micro-batch per replica: nothing to fill, so nothing to pay for
    else:
        assert micro == max(1, -(-share // (2 * stages)))
        assert -(-share // micro) <= 2 * stages  # about 2P micro-batches, never more


def test_the_default_micro_batch_of_the_issue_14_user() -> None:
    assert default_micro_batch_size(12, 1, 1) == 12  # was 6: two micro-batches on one GPU
    assert default_micro_batch_size(12, 1, 5) == 3  # D not dividing B: the largest share in one micro-batch
    assert default_micro_batch_size(12, 2, 1) == 3  # 2 stages: 4 micro-batches fill the pipeline
