"""In-process checks of the pieces the batch invariant rests on."""

from __future__ import annotations

import torch

from morphing.layout import make_layout
from worker_agent.runtime.model.model_api import Dropout, assign_dropout_keys, sample_context
from worker_agent.runtime.numerics.job import step_indices


def test_step_indices_do_not_depend_on_the_layout_and_replicas_partition_them() -> None:
    batch = step_indices(5, 7, 50, seed=3)
    assert batch == step_indices(5, 7, 50, seed=3) and len(batch) == 7
    for d in (1, 2, 3, 4):
        layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=d, micro_batch_size=2, global_batch=7)
        slices = [layout.replica_slice(r) for r in range(d)]
        assert [i for lo, hi in slices for i in batch[lo:hi]] == batch


def test_epochs_are_permutations() -> None:
    seen = [i for s in range(10) for i in step_indices(s, 5, 50, seed=0)]
    assert sorted(seen) == list(range(50))


def test_dropout_mask_is_a_function_of_the_sample_not_of_the_batch() -> None:
    drop = Dropout(0.5)
    assign_dropout_keys([("layer", drop)])
    x = torch.ones(3, 4, 8, dtype=torch.float64)
    with sample_context(seed=1, step=7, sample_ids=torch.tensor([10, 11, 12])):
        together = drop(x)
    with sample_context(seed=1, step=7, sample_ids=torch.tensor([11])):
        alone = drop(x[:1])
    with sample_context(seed=1, step=8, sample_ids=torch.tensor([11])):
        next_step = drop(x[:1])
    assert torch.equal(together[1], alone[0])
    assert not torch.equal(alone, next_step)
    assert 0 < int((together == 0).sum()) < together.numel()
