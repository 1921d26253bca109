"""Layout-free dropout: masks are a pure function of (seed, step, sample, layer, element)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_agent.runtime.dropout import (
    ELEMENT,
    GOLDEN,
    apply_dropout,
    drop_threshold,
    finalise_int,
    keep_mask,
    stream_key,
)

MASK64 = (1 << 64) - 1


def reference_keep(seed: int, step: int, key: int, sample: int, element: int, p: float) -> bool:
    """The mask bit computed with exact Python integers: the tensor path must wrap the same way."""
    start = finalise_int(((sample * (GOLDEN & MASK64)) & MASK64) ^ (stream_key(seed, step, key) & MASK64))
    hashed = finalise_int((start + element * (ELEMENT & MASK64)) & MASK64)
    return (hashed >> 40) >= drop_threshold(p)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    step=st.integers(0, 10**9),
    key=st.integers(0, 2**63 - 1),
    samples=st.lists(st.integers(0, 2**40), min_size=1, max_size=4),
    p=st.floats(0.0, 0.99),
)
def test_tensor_masks_equal_the_exact_integer_reference(
    seed: int, step: int, key: int, samples: list[int], p: float
) -> None:
    mask = keep_mask(torch.Size([len(samples), 3, 5]), torch.tensor(samples), seed, step, key, p).reshape(
        len(samples), -1
    )
    for i, sample in enumerate(samples):
        for element in range(15):
            assert bool(mask[i, element]) == reference_keep(seed, step, key, sample, element, p)


def test_a_sample_gets_the_same_mask_in_any_micro_batch() -> None:
    ids = torch.tensor([4, 9, 17, 23, 42])
    whole = keep_mask(torch.Size([5, 8, 16]), ids, 3, 11, 99, 0.25)
    for lo, hi in ((0, 2), (2, 5), (3, 4)):
        part = keep_mask(torch.Size([hi - lo, 8, 16]), ids[lo:hi], 3, 11, 99, 0.25)
        assert torch.equal(whole[lo:hi], part)
    assert not torch.equal(whole, keep_mask(torch.Size([5, 8, 16]), ids, 3, 12, 99, 0.25))
    assert not torch.equal(whole, keep_mask(torch.Size([5, 8, 16]), ids, 3, 11, 98, 0.25))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_dropped_fraction_is_p(p: float) -> None:
    mask = keep_mask(torch.Size([64, 4096]), torch.arange(64), 0, 0, 1, p)
    dropped = 1.0 - mask.double().mean().item()
    assert abs(dropped - p) < 0.01


def test_the_mask_does_not_depend_on_the_activation_dtype() -> None:
    ids = torch.tensor([1, 2, 3])
    x = torch.ones(3, 32)
    masks = [
        apply_dropout(x.to(dtype), ids, 5, 6, 7, 0.3) != 0 for dtype in (torch.float64, torch.float32, torch.bfloat16)
    ]
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[1], masks[2])
    kept = apply_dropout(x.double(), ids, 5, 6, 7, 0.3)
    assert torch.allclose(kept[kept != 0], torch.full_like(kept[kept != 0], 1 / 0.7))


def test_p_zero_keeps_everything_and_p_one_drops_everything() -> None:
    x = torch.ones(2, 10)
    assert torch.equal(apply_dropout(x, torch.tensor([0, 1]), 0, 0, 0, 0.0), x)
    assert not apply_dropout(x, torch.tensor([0, 1]), 0, 0, 0, 1.0).any()
    with pytest.raises(ValueError, match="outside"):
        drop_threshold(1.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu on a GPU machine)")
def test_cuda_masks_are_bit_identical_to_cpu_masks() -> None:
    ids = torch.arange(0, 4096, 7)
    shape = torch.Size([ids.numel(), 33, 17])
    cpu = keep_mask(shape, ids, 12, 345, 6789, 0.2)
    gpu = keep_mask(shape, ids.cuda(), 12, 345, 6789, 0.2)
    assert torch.equal(cpu, gpu.cpu())
