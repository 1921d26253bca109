"""Layout-free dropout: masks are a pure function of (seed, step, sample, layer, element)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from worker_agent.runtime.numerics.dropout import (
    GOLDEN,
    MASK64,
    Masks,
    apply_dropout,
    drop_threshold,
    eager_kernel,
    element_words,
    finalise_int,
    fused_kernel,
    keep_mask,
    layer_word,
    sample_words_uncached,
    signed,
    xorshift16,
)

MASK32 = (1 << 32) - 1


def reference_keep(seed: int, step: int, key: int, sample: int, element: int, p: float) -> bool:
    """The mask bit from exact Python integers and murmur3's constants: the tensor path must wrap the same way."""
    step_key = finalise_int(seed ^ finalise_int(step))
    s = finalise_int(((sample * GOLDEN) & MASK64) ^ step_key) & MASK32
    layer = finalise_int(step_key ^ finalise_int(key)) & MASK32
    h = ((element * 0x9E3779B9) & MASK32) ^ s ^ layer
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h - (1 << 32) * (h >> 31) >= round(p * 2**32) - 2**31  # h read as a signed 32-bit integer


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    step=st.integers(0, 10**9),
    key=st.integers(0, 2**63 - 1),
    samples=st.lists(st.integers(-1, 2**40), min_size=1, max_size=4),
    p=st.floats(0.0, 0.99),
)
def test_tensor_masks_equal_the_exact_integer_reference(
    seed: int, step: int, key: int, samples: list[int], p: float
) -> None:
    ids = torch.tensor(samples)
    mask = keep_mask(torch.Size([len(samples), 3, 5]), ids, seed, step, key, p).reshape(len(samples), -1)
    for i, sample in enumerate(samples):
        for element in range(15):
            assert bool(mask[i, element]) == reference_keep(seed, step, key, sample, element, p)


def test_large_element_indices_follow_the_reference_too() -> None:
    ids = torch.tensor([3, 2**33 + 1])
    mask = keep_mask(torch.Size([2, 70000]), ids, 5, 6, 7, 0.4)
    for i, sample in enumerate((3, 2**33 + 1)):
        for element in (0, 65535, 65536, 69999):
            assert bool(mask[i, element]) == reference_keep(5, 6, 7, sample, element, 0.4)


def test_a_sample_gets_the_same_mask_in_any_micro_batch() -> None:
    ids = torch.tensor([4, 9, 17, 23, 42])
    whole = keep_mask(torch.Size([5, 8, 16]), ids, 3, 11, 99, 0.25)
    for lo, hi in ((0, 2), (2, 5), (3, 4)):
        part = keep_mask(torch.Size([hi - lo, 8, 16]), ids[lo:hi], 3, 11, 99, 0.25)
        assert torch.equal(whole[lo:hi], part)
    assert not torch.equal(whole, keep_mask(torch.Size([5, 8, 16]), ids, 3, 12, 99, 0.25))
    assert not torch.equal(whole, keep_mask(torch.Size([5, 8, 16]), ids, 3, 11, 98, 0.25))


def test_cached_sample_words_follow_in_place_changes_of_the_ids() -> None:
    ids, masks = torch.tensor([1, 2, 3]), Masks()
    before = keep_mask(torch.Size([3, 64]), ids, 0, 0, 5, 0.5, masks)
    assert torch.equal(before, keep_mask(torch.Size([3, 64]), ids, 0, 0, 5, 0.5)), "kept or not, the same mask"
    ids[0] = 7  # the same tensor object, a new version: the cache must not answer with sample 1's words
    after = keep_mask(torch.Size([3, 64]), ids, 0, 0, 5, 0.5, masks)
    assert torch.equal(after[0], keep_mask(torch.Size([1, 64]), torch.tensor([7]), 0, 0, 5, 0.5)[0])
    assert torch.equal(before[1:], after[1:]) and not torch.equal(before[0], after[0])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_dropped_fraction_is_p(p: float) -> None:
    mask = keep_mask(torch.Size([64, 4096]), torch.arange(64), 0, 0, 1, p)
    dropped = 1.0 - mask.double().mean().item()
    assert abs(dropped - p) < 0.01
    per_sample = 1.0 - mask.double().mean(dim=1)
    assert float((per_sample - p).abs().max()) < 0.05  # 4096 draws each: 5 standard deviations at p=0.5


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_masks_of_neighbouring_samples_steps_layers_and_elements_are_uncorrelated() -> None:
    """Correlations over 262,144 decisions: chance alone gives |r| ~ 0.002; 0.01 is five standard deviations."""
    shape = torch.Size([64, 4096])
    ids = torch.arange(64)
    base = keep_mask(shape, ids, 0, 10, 1, 0.5)
    neighbours = {
        "next sample": (keep_mask(shape, ids + 1, 0, 10, 1, 0.5), base),
        "next step": (keep_mask(shape, ids, 0, 11, 1, 0.5), base),
        "next layer key": (keep_mask(shape, ids, 0, 10, 2, 0.5), base),
        "next seed": (keep_mask(shape, ids, 1, 10, 1, 0.5), base),
        "next element": (base[:, 1:], base[:, :-1]),
        "element 64 on": (base[:, 64:], base[:, :-64]),
        "samples 2**32 apart": (keep_mask(shape, ids + 2**32, 0, 10, 1, 0.5), base),
    }
    for name, (a, b) in neighbours.items():
        assert abs(_correlation(a, b)) < 0.01, name
    # the sample and layer words meet by xor: two samples' masks in one layer against the same two in another
    other = keep_mask(shape, ids, 0, 10, 2, 0.5)
    assert abs(_correlation(base[1:] ^ base[:-1], other[1:] ^ other[:-1])) < 0.01


def test_the_eager_and_the_compilable_kernel_agree_bit_for_bit() -> None:
    ids = torch.tensor([0, 7, -1, 2**35])
    words = sample_words_uncached(ids, 3, 4)
    layer = signed(xorshift16(layer_word(3, 4, 5)), 32)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        x = torch.randn(4, 3, 11).to(dtype)
        for p in (0.1, 0.5):
            threshold = drop_threshold(p) - 2**31
            eager = eager_kernel(x, words, layer, threshold, 1 / (1 - p))
            fused, keep = fused_kernel(
                x.reshape(4, -1), words ^ layer, element_words(33, x.device), threshold, 1 / (1 - p)
            )
            assert torch.equal(eager, fused.reshape(x.shape))
            assert torch.equal(keep.view(torch.bool).reshape(x.shape), keep_mask(x.shape, ids, 3, 4, 5, p))
    assert torch.equal(apply_dropout(x, ids, 3, 4, 5, 0.5), eager_kernel(x, words, layer, 0, 2.0))


def test_the_mask_does_not_depend_on_the_activation_dtype() -> None:
    ids = torch.tensor([1, 2, 3])
    x = torch.ones(3, 32)
    masks = [
        apply_dropout(x.to(dtype), ids, 5, 6, 7, 0.3) != 0 for dtype in (torch.float64, torch.float32, torch.bfloat16)
    ]
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[1], masks[2])
    kept = apply_dropout(x.double(), ids, 5, 6, 7, 0.3)
    assert torch.allclose(kept[kept != 0], torch.full_like(kept[kept != 0], 1 / 0.7))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_gradient_is_the_same_mask_times_the_scale(dtype: torch.dtype) -> None:
    """What torch's dropout backward computes from its mask (``native_dropout_backward``), bit for bit."""
    ids = torch.tensor([2, 5])
    x = torch.randn(2, 6, 7).to(dtype).requires_grad_(True)
    weights = torch.randn(2, 6, 7).to(dtype)
    out = apply_dropout(x, ids, 1, 2, 3, 0.1)
    (grad,) = torch.autograd.grad(out, x, weights)
    keep = keep_mask(x.shape, ids, 1, 2, 3, 0.1)
    assert torch.equal(grad, torch.ops.aten.native_dropout_backward(weights, keep, 1 / 0.9))
    assert torch.equal(out.detach(), torch.ops.aten.native_dropout_backward(x.detach(), keep, 1 / 0.9))


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


def test_a_dropout_module_called_twice_in_a_layer_draws_two_masks_and_again_the_same_two_in_any_layout() -> None:
    """One Dropout on two residual branches: fresh masks per call (as torch's), counted per layer, so a
    layer recomputed alone or run in another stage draws exactly the same ones."""
    from torch import nn

    from worker_agent.runtime.model.model_api import Dropout, assign_dropout_keys, sample_context
    from worker_agent.runtime.model.partition import StageModule

    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.drop(x), self.drop(x)], dim=1)

    layers: list[nn.Module] = [TwoBranches(), TwoBranches()]
    assign_dropout_keys([("a", layers[0]), ("b", layers[1])])
    x, ids = torch.ones(3, 64, dtype=torch.float64), torch.tensor([4, 9, 2])
    with sample_context(7, 3, ids):
        first = layers[0](x)
    assert not torch.equal(first[:, :64], first[:, 64:])  # two masks, not one repeated
    together = StageModule(layers)
    with sample_context(7, 3, ids):
        whole = together(x)
        alone = StageModule(layers[1:])(StageModule(layers[:1])(x))  # each layer in a stage of its own
        recomputed = StageModule(layers, recompute=True)(x)
    assert torch.equal(whole, alone) and torch.equal(whole, recomputed)
