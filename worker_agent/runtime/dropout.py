"""Layout-free dropout masks: a counter-based hash, computed with integer tensor ops on any device.

The keep/drop decision for one element is a pure function of (seed, step, global sample index,
layer key, element index), so a sample gets the same mask whichever micro-batch, replica or process
holds it, and a resumed run draws the same masks as an uninterrupted one: no generator state exists to
be checkpointed. The hash is murmur3's 64-bit finaliser on wrapping int64 arithmetic, which CPU and CUDA
compute bit-identically, and the decision compares integers (never floats), so masks do not depend on
the device or the activation dtype.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_THRESHOLD_BITS = 24  # the top 24 bits of the hash decide: p is resolved to 1 / 16,777,216


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


MIX_1 = _signed(0xFF51AFD7ED558CCD)
MIX_2 = _signed(0xC4CEB9FE1A85EC53)
GOLDEN = _signed(0x9E3779B97F4A7C15)
ELEMENT = _signed(0xD6E8FEB86659FD93)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 lanes (torch shifts signed integers arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _finalise(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shift_right(x, 33)
    x = x * MIX_1
    x = x ^ _shift_right(x, 33)
    x = x * MIX_2
    return x ^ _shift_right(x, 33)


def finalise_int(x: int) -> int:
    """The same finaliser on one Python integer (exact, for keys and for checking the tensor path)."""
    x &= _MASK64
    x ^= x >> 33
    x = (x * (MIX_1 & _MASK64)) & _MASK64
    x ^= x >> 33
    x = (x * (MIX_2 & _MASK64)) & _MASK64
    return x ^ (x >> 33)


def stream_key(seed: int, step: int, layer_key: int) -> int:
    """One 64-bit word for (seed, step, layer): the per-sample hashes start from it."""
    return _signed(finalise_int(seed ^ finalise_int(step ^ finalise_int(layer_key))))


def drop_threshold(p: float) -> int:
    """Hash values (top bits) below this are dropped: a fraction ``p`` of them."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability {p} is outside [0, 1]")
    return round(p * (1 << _THRESHOLD_BITS))


def keep_mask(
    shape: torch.Size, sample_ids: torch.Tensor, seed: int, step: int, layer_key: int, p: float
) -> torch.Tensor:
    """A boolean mask of ``shape`` (samples first) that keeps each element with probability ``1 - p``."""
    device = sample_ids.device
    per_sample = shape[1:].numel()
    samples = sample_ids.to(torch.int64).reshape(-1, 1)
    start = _finalise(samples * GOLDEN ^ stream_key(seed, step, layer_key))
    elements = torch.arange(per_sample, dtype=torch.int64, device=device).reshape(1, -1)
    hashed = _finalise(start + elements * ELEMENT)
    keep = _shift_right(hashed, 64 - _THRESHOLD_BITS) >= drop_threshold(p)
    return keep.reshape(shape)


def apply_dropout(
    x: torch.Tensor, sample_ids: torch.Tensor, seed: int, step: int, layer_key: int, p: float
) -> torch.Tensor:
    """``x`` with the layout-free mask applied and the survivors scaled by ``1 / (1 - p)``."""
    if p >= 1.0:
        return torch.zeros_like(x)
    keep = keep_mask(x.shape, sample_ids.to(x.device), seed, step, layer_key, p)
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))
