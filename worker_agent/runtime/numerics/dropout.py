"""Layout-free dropout masks: a counter-based hash, computed with integer tensor ops on any device.

The keep/drop decision for one element is a pure function of (seed, step, global sample index, layer
key, element index), so a sample gets the same mask whichever micro-batch, replica or process holds it,
and a resumed run draws the same masks as an uninterrupted one: no generator state exists to be
checkpointed. Only wrapping integer multiplication, xor, and right shifts followed by a mask (torch
shifts signed integers arithmetically; the mask makes that irrelevant) are used, which CPU, CUDA and
compiled kernels compute bit-identically, and the decision compares integers (never floats), so masks do
not depend on the device or the activation dtype.

The hash, with every word 32 bits wide and ``fmix`` murmur3's 64-bit finaliser:

- ``step_key = fmix(seed ^ fmix(step))`` (64 bits);
- per sample ``S = low32(fmix(sample * GOLDEN ^ step_key))``, per layer
  ``L = low32(fmix(step_key ^ fmix(layer_key)))``, per element ``E = element * 0x9E3779B9``;
- ``h = g(E ^ S ^ L)``, where ``g`` is murmur3's 32-bit finaliser ``fmix32`` without its last xorshift
  (which only changes the low 16 bits, while the decision is an order comparison decided by the top bits);
- the element is dropped when ``h`` (unsigned) ``< round(p * 2**32)``.

``S`` is computed once per micro-batch and ``E`` once per activation shape (both kept by :class:`Masks`, which
the runtime's sample context carries), so an eager call costs seven passes over 32-bit lanes plus the multiply;
``worker_agent.runtime.numerics.dropout_fused`` compiles the whole thing into one kernel on CUDA. The first xorshift of
``g`` is distributed over the xor (it is linear), so the cached words carry it and the full-size passes skip it.
"""

from __future__ import annotations

import math
import os
import weakref
from collections import OrderedDict

import torch

from worker_agent.runtime.numerics import dropout_fused

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1
MIX_1 = 0xFF51AFD7ED558CCD  # murmur3 fmix64
MIX_2 = 0xC4CEB9FE1A85EC53
GOLDEN = 0x9E3779B97F4A7C15
ELEMENT = 0x9E3779B9  # the element index's Weyl multiplier
MIX32_1 = 0x85EBCA6B  # murmur3 fmix32
MIX32_2 = 0xC2B2AE35
MAX_ELEMENTS = 1 << 32  # per sample: element indices are 32-bit words
_ELEMENT_CACHE_BYTES = 1 << 26


def signed(value: int, bits: int) -> int:
    """``value`` modulo 2**bits as a two's-complement integer (what an int32 / int64 lane holds)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def finalise_int(x: int) -> int:
    """murmur3's 64-bit finaliser on one Python integer (exact): keys, and the reference in tests."""
    x &= MASK64
    x ^= x >> 33
    x = (x * MIX_1) & MASK64
    x ^= x >> 33
    x = (x * MIX_2) & MASK64
    return x ^ (x >> 33)


def step_key(seed: int, step: int) -> int:
    """One 64-bit word for (seed, step): the sample and layer words start from it."""
    return finalise_int(seed ^ finalise_int(step))


def layer_word(seed: int, step: int, layer_key: int) -> int:
    """``L``: the 32-bit word of (seed, step, layer)."""
    return finalise_int(step_key(seed, step) ^ finalise_int(layer_key)) & MASK32


def drop_threshold(p: float) -> int:
    """Hash values (unsigned 32-bit) below this are dropped: a fraction ``p`` of them."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability {p} is outside [0, 1]")
    return round(p * (1 << 32))


def xorshift16(word: int) -> int:
    """``word ^ (word >> 16)`` on a 32-bit word: the first step of ``g``, carried by the cached words."""
    word &= MASK32
    return word ^ (word >> 16)


def _xorshift_(h: torch.Tensor, bits: int) -> torch.Tensor:
    """In place ``h ^= h >>> bits`` on int32 lanes (the mask turns the arithmetic shift into a logical one)."""
    return h.bitwise_xor_(h.bitwise_right_shift(bits).bitwise_and_((1 << (32 - bits)) - 1))


def _low32(x: torch.Tensor) -> torch.Tensor:
    """The low 32 bits of int64 lanes as int32 lanes, without relying on how a narrowing cast wraps."""
    return ((x & MASK32) ^ (1 << 31)).sub_(1 << 31).to(torch.int32)


def _finalise(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 64-bit finaliser on int64 lanes (wrapping multiplication)."""
    for multiplier in (MIX_1, MIX_2):
        x = x ^ ((x >> 33) & ((1 << 31) - 1))
        x = x * signed(multiplier, 64)
    return x ^ ((x >> 33) & ((1 << 31) - 1))


def sample_word(sample: int, seed: int, step: int) -> int:
    """``xorshift16(S)`` of one sample, an unsigned 32-bit word (exact Python integers)."""
    return xorshift16(finalise_int((sample * GOLDEN) ^ step_key(seed, step)))


def sample_words_uncached(sample_ids: torch.Tensor, seed: int, step: int) -> torch.Tensor:
    """``xorshift16(S)`` of every sample, as int32 lanes on the ids' device.

    Ids on the CPU are hashed as Python integers (a micro-batch holds few samples, and one tensor op per
    step of the hash would cost more); ids on a GPU with int64 tensor ops there, never synchronising.
    """
    if sample_ids.device.type == "cpu":
        key = step_key(seed, step)
        words = [xorshift16(finalise_int((int(i) * GOLDEN) ^ key)) for i in sample_ids.tolist()]
        return torch.tensor([signed(w, 32) for w in words], dtype=torch.int32)
    mixed = _finalise(sample_ids.to(torch.int64) * signed(GOLDEN, 64) ^ signed(step_key(seed, step), 64))
    return _xorshift_(_low32(mixed), 16)


class _SampleWords:
    """The last few micro-batches' sample words, keyed by the very ids tensor (held weakly) and its version.

    Every dropout layer of a micro-batch receives the same ids tensor, so its words are computed once.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: list[tuple[weakref.ref[torch.Tensor], int, int, int, torch.device, torch.Tensor]] = []

    def get(self, sample_ids: torch.Tensor, seed: int, step: int, device: torch.device) -> torch.Tensor:
        version = sample_ids._version
        for ref, seen_version, seen_seed, seen_step, seen_device, words in self.entries:
            if (
                ref() is sample_ids
                and seen_version == version
                and (seen_seed, seen_step) == (seed, step)
                and seen_device == device
            ):
                return words
        words = sample_words_uncached(sample_ids.to(device), seed, step)
        self.entries = [(weakref.ref(sample_ids), version, seed, step, device, words), *self.entries]
        del self.entries[self.size :]
        return words


def element_words(per_sample: int, device: torch.device) -> torch.Tensor:
    """``xorshift16(E)`` of elements ``0 .. per_sample - 1`` as int32 lanes."""
    if per_sample > MAX_ELEMENTS:
        raise ValueError(f"layout-free dropout numbers elements with 32 bits; a sample has {per_sample}")
    if per_sample < 1 << 31:
        words = torch.arange(per_sample, dtype=torch.int32, device=device).mul_(signed(ELEMENT, 32))
    else:
        words = _low32(torch.arange(per_sample, dtype=torch.int64, device=device) * ELEMENT)
    return _xorshift_(words, 16)


def hash_constants(device: torch.device) -> tuple[torch.Tensor, ...]:
    """The hash's constants as int32 tensors on ``device`` (an int32 op with a Python integer converts it first)."""
    values = (signed(MIX32_1, 32), 13, (1 << 19) - 1, signed(MIX32_2, 32))
    return tuple(torch.tensor(v, dtype=torch.int32, device=device) for v in values)


class Masks:
    """What layout-free dropout keeps between calls: the last micro-batches' sample words, each shape's element
    words, the hash's constants per device, and the compiled kernels with their verdicts. One per trainer process
    (:class:`worker_agent.runtime.process.trainer_process.TrainerProcess`), carried to the layers by the sample context
    (:func:`worker_agent.runtime.model.model_api.sample_context`); a fresh one computes the same masks, only colder."""

    def __init__(self) -> None:
        self.sample_words = _SampleWords()
        self.kernels = dropout_fused.Kernels()
        self._elements: OrderedDict[tuple[int, torch.device], torch.Tensor] = OrderedDict()
        self._constants: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def element_words(self, per_sample: int, device: torch.device) -> torch.Tensor:
        """:func:`element_words`, kept for small shapes (the least recently used go past the cache's bytes)."""
        cached = self._elements.get((per_sample, device))
        if cached is not None:
            self._elements.move_to_end((per_sample, device))
            return cached
        words = element_words(per_sample, device)
        if per_sample * 4 <= _ELEMENT_CACHE_BYTES // 4:
            self._elements[(per_sample, device)] = words
            while sum(w.numel() * 4 for w in self._elements.values()) > _ELEMENT_CACHE_BYTES:
                self._elements.popitem(last=False)
        return words

    def constants(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._constants:
            self._constants[device] = hash_constants(device)
        return self._constants[device]


def _hash(per_sample: int, words: torch.Tensor, layer: int, masks: Masks | None) -> torch.Tensor:
    """``g(E ^ S ^ L)`` as int32 lanes ``[samples, per_sample]``: six full-size passes, four in place."""
    device = words.device
    columns = masks.element_words(per_sample, device) if masks else element_words(per_sample, device)
    mix_1, shift, low_19, mix_2 = masks.constants(device) if masks else hash_constants(device)
    h = torch.bitwise_xor(columns.view(1, -1), (words ^ layer).view(-1, 1))
    h.mul_(mix_1)
    h.bitwise_xor_(h.bitwise_right_shift(shift).bitwise_and_(low_19))
    return h.mul_(mix_2)


def keep_mask(
    shape: torch.Size,
    sample_ids: torch.Tensor,
    seed: int,
    step: int,
    layer_key: int,
    p: float,
    masks: Masks | None = None,
) -> torch.Tensor:
    """A boolean mask of ``shape`` (samples first) that keeps each element with probability ``1 - p``."""
    threshold = drop_threshold(p)
    if threshold >= 1 << 32:
        return torch.zeros(shape, dtype=torch.bool, device=sample_ids.device)
    words = _sample_words(masks, sample_ids, seed, step, sample_ids.device)
    h = _hash(math.prod(shape[1:]), words, signed(xorshift16(layer_word(seed, step, layer_key)), 32), masks)
    return torch.ge(h, threshold - (1 << 31)).reshape(shape)  # unsigned h >= t, on signed lanes


def _sample_words(
    masks: Masks | None, sample_ids: torch.Tensor, seed: int, step: int, device: torch.device
) -> torch.Tensor:
    if masks is None:
        return sample_words_uncached(sample_ids.to(device), seed, step)
    return masks.sample_words.get(sample_ids, seed, step, device)


def apply_dropout(
    x: torch.Tensor,
    sample_ids: torch.Tensor,
    seed: int,
    step: int,
    layer_key: int,
    p: float,
    masks: Masks | None = None,
) -> torch.Tensor:
    """``x`` with the layout-free mask applied and the survivors scaled by ``1 / (1 - p)``; ``masks`` keeps what
    the next call can reuse (the runtime's; None: nothing kept, and no compiled kernel).

    On CUDA (with triton) the mask and the multiply run as one compiled kernel after a one-time check that
    it equals this eager path (``dropout_fused``); ``SPOTMORPH_DROPOUT_COMPILE=off`` keeps everything eager.
    """
    threshold = drop_threshold(p)
    if threshold >= 1 << 32:
        return torch.zeros_like(x)
    words = _sample_words(masks, sample_ids, seed, step, x.device)
    layer = signed(xorshift16(layer_word(seed, step, layer_key)), 32)
    scale = 1.0 / (1.0 - p)
    per_sample = math.prod(x.shape[1:])
    mode = os.environ.get(dropout_fused.ENV, "auto")
    if masks is not None and dropout_fused.wanted(x, per_sample, mode):
        t = threshold - (1 << 31)
        out = masks.kernels.run(fused_kernel, eager_kernel, masks.element_words, x, words, layer, t, scale)
        if out is not None:
            return out
    return _eager(x, words, layer, threshold - (1 << 31), scale, masks)


def warm_up(device: torch.device, dtypes: tuple[torch.dtype, ...], masks: Masks) -> None:
    """Check and compile ``masks``' fused kernel (where it is wanted) for each dtype on ``device`` now, at start-up:
    done lazily, a cold compile would land in the first step and could outlast the peer timeout.
    A bad ``SPOTMORPH_DROPOUT_COMPILE`` is a user error here, not a failure mid-step."""
    from morphing.errors import UserInputError

    mode = os.environ.get(dropout_fused.ENV, "auto")
    if mode not in dropout_fused.MODES:
        raise UserInputError(
            f"{dropout_fused.ENV}={mode!r} is not one of {', '.join(dropout_fused.MODES)}; unset it, or use off"
        )
    ids = torch.arange(2, device=device)
    for dtype in dtypes:
        x = torch.ones(2, 8, 3, device=device, dtype=dtype, requires_grad=True)  # not 1: no 0/1 specialisation
        torch.autograd.backward(apply_dropout(x, ids, 0, 0, 0, 0.5, masks).sum())


def eager_kernel(x: torch.Tensor, words: torch.Tensor, layer: int, threshold: int, scale: float) -> torch.Tensor:
    """Mask and multiply from the sample words, in eager passes (``threshold`` is signed: ``t - 2**31``).

    Autograd keeps only the boolean mask, as torch's dropout does. (Not ``native_dropout_backward`` as the
    forward op: its own derivative rounds the scale to bfloat16 first, unlike torch's dropout backward.)
    """
    return _eager(x, words, layer, threshold, scale, None)


def _eager(
    x: torch.Tensor, words: torch.Tensor, layer: int, threshold: int, scale: float, masks: Masks | None
) -> torch.Tensor:
    keep = torch.ge(_hash(math.prod(x.shape[1:]), words, layer, masks), threshold).reshape(x.shape)
    return x * keep * scale


def fused_kernel(
    x: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor, threshold: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`eager_kernel` for ``torch.compile`` (no cache, nothing in place) on ``x`` of shape
    ``[samples, elements]``, from the sample words xor the layer word (``rows``) and :func:`element_words`
    (``columns``), both int32 tensors; it also returns the mask (as uint8 lanes) for the backward pass.

    The words come in as tensors because inductor's Triton code holds a symbolic integer (the layer word, an
    ``arange``'s length) in 64 bits: mixed into the hash it made the multiplications stop wrapping at 32 bits
    (found on an H100; the self-check refused the kernel)."""
    h = columns.view(1, -1) ^ rows.view(-1, 1)
    h = h * signed(MIX32_1, 32)
    keep = (h ^ ((h >> 13) & 0x7FFFF)) * signed(MIX32_2, 32) >= threshold
    return x * keep * scale, keep.to(torch.uint8)
