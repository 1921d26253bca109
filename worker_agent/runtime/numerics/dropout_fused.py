"""Layout-free dropout as one compiled kernel, used only after it proved equal to the eager path.

Eager, the mask costs several full-size passes over 32-bit lanes, so on a GPU (where each pass is bound by
memory) it would cost several times torch's dropout. ``torch.compile`` (inductor, dynamic shapes) turns the
hash, the comparison and the multiply into one kernel that reads the activation once and writes the result
and a one-byte mask, as torch's own dropout kernel does; the backward pass is torch's
``native_dropout_backward`` of that mask (what ``torch.nn.Dropout`` runs), so the compiled graph is
forward-only and cheap to call. It is used when the activation is on CUDA and triton is importable
(``SPOTMORPH_DROPOUT_COMPILE``: ``auto``, the default; ``on`` also compiles for CPU activations, for tests and
benchmarks; ``off`` never).

Before first use on a (device, dtype) the compiled kernel runs on two small probes, with autograd, and its
outputs and input gradients must equal bit for bit those of the eager kernel computed on the CPU, the
reference every other rank may be using; otherwise, or if compiling fails (then or later, for a new shape),
dropout stays eager there, with one warning line in the log. The mask is integer arithmetic, so equality is
the expected outcome; the check guards against a backend that wraps, shifts or rounds differently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint

ENV = "SPOTMORPH_DROPOUT_COMPILE"
MODES = ("auto", "on", "off")
Eager = Callable[[torch.Tensor, torch.Tensor, int, int, float], torch.Tensor]
# (x, row words S ^ L, column words E, threshold, scale): every word an int32 tensor, so no symbolic integer
# (which inductor's Triton code holds in 64 bits) enters the 32-bit wrapping arithmetic.
Fused = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, float], tuple[torch.Tensor, torch.Tensor]]
Columns = Callable[[int, torch.device], torch.Tensor]  # the column words of a row length, on a device
_PROBES = (((3, 5, 7), -(1 << 30), 4 / 3, -123456789), ((2, 13), 1 << 29, 1 / 0.375, 987654321))
_PROBE_WORDS = (-1640531527, 2027808484, -1)

log = logging.getLogger(__name__)
# What non-reentrant recomputation raises from its saved-tensor hook to stop a re-run early (torch-private).
_RECOMPUTATION_STOPPED: tuple[type[BaseException], ...] = tuple(
    c for c in (getattr(torch.utils.checkpoint, "_StopRecomputationError", None),) if isinstance(c, type)
)


def triton_available() -> bool:
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return bool(has_triton())


def wanted(x: torch.Tensor, per_sample: int, mode: str) -> bool:
    """Whether ``x`` should go through the compiled kernel (before the one-time check decides if it may)."""
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r} is not one of {', '.join(MODES)}; unset it, or use off to stay eager")
    if mode == "off" or x.numel() == 0 or per_sample >= 1 << 31:
        return False
    return mode == "on" or (x.device.type == "cuda" and triton_available())


def compile_kernel(kernel: Fused) -> Fused:
    """``kernel`` compiled for dynamic shapes and symbolic scalars (layer word, threshold, scale), on first call."""
    return torch.compile(kernel, dynamic=True, fullgraph=True)


class _Masked(torch.autograd.Function):
    """Forward: the compiled kernel (run without autograd); backward: torch's dropout backward of its mask."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rows: torch.Tensor, *rest: Any) -> torch.Tensor:
        columns, threshold, scale, kernel = rest
        out, keep = kernel(x.detach(), rows, columns, threshold, scale)  # not views: no guards on bases
        ctx.save_for_backward(keep.view(torch.bool))
        ctx.scale = scale
        return out  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (keep,) = ctx.saved_tensors
        return (torch.ops.aten.native_dropout_backward(grads[0], keep, ctx.scale), None, None, None, None, None)


def masked(
    kernel: Fused, columns: Columns, x: torch.Tensor, words: torch.Tensor, layer: int, threshold: int, scale: float
) -> torch.Tensor:
    """``kernel`` applied to ``x`` flattened to ``[samples, elements]`` (one graph for every rank), with autograd;
    the layer word is folded into the sample words here, eagerly, on int32 lanes."""
    flat = x.reshape(x.shape[0], -1)
    rows, cols = (words ^ layer).detach(), columns(flat.shape[1], x.device)
    out: torch.Tensor = _Masked.apply(flat, rows, cols, threshold, scale, kernel)  # type: ignore[no-untyped-call]
    return out.view(x.shape)


class Kernels:
    """The compiled kernels and, per (device, dtype), the verdict of their check (None: eager there from now on):
    compiling and checking cost seconds, so the process keeps them (in
    :class:`worker_agent.runtime.numerics.dropout.Masks`)."""

    def __init__(self) -> None:
        self.verdicts: dict[tuple[str, int | None, torch.dtype], Fused | None] = {}
        self._compiled: dict[Fused, Fused] = {}

    def compiled(self, kernel: Fused) -> Fused:
        """``kernel`` compiled once (:func:`compile_kernel`)."""
        if kernel not in self._compiled:
            self._compiled[kernel] = compile_kernel(kernel)
        return self._compiled[kernel]

    def run(
        self,
        kernel: Fused,
        reference: Eager,
        columns: Columns,
        x: torch.Tensor,
        words: torch.Tensor,
        layer: int,
        threshold: int,
        scale: float,
    ) -> torch.Tensor | None:
        """The compiled ``kernel``'s result, or None when this (device, dtype) must use the eager path."""
        key = (x.device.type, x.device.index, x.dtype)
        if key not in self.verdicts:
            # The probes' own tensors are saved as themselves: inside a recomputed (checkpointed) region the
            # region's hooks would take them, and its early stop would end the probe as if the kernel had failed.
            with torch.autograd.graph.saved_tensors_hooks(_itself, _itself), torch.enable_grad():
                self.verdicts[key] = check(self.compiled(kernel), reference, columns, x.device, x.dtype)
        fused = self.verdicts[key]
        if fused is None:
            return None
        try:
            return masked(fused, columns, x, words, layer, threshold, scale)
        except _RECOMPUTATION_STOPPED:
            raise  # recomputation ending its re-run early from the saved-tensor hook: control flow, not a failure
        except Exception as error:  # a recompilation (a new specialisation) failed: eager from now on
            self.verdicts[key] = None
            log.warning(
                "layout-free dropout: the compiled kernel failed on %s %s (%s); using eager",
                x.device,
                x.dtype,
                _say(error),
            )
            return None


def _itself(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def check(fused: Fused, reference: Eager, columns: Columns, device: torch.device, dtype: torch.dtype) -> Fused | None:
    """``fused`` (a compiled kernel), if on two probes it gives what ``reference`` gives on the CPU; else None
    (logged)."""
    try:
        for shape, threshold, scale, layer in _PROBES:
            x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)
            words = torch.tensor(_PROBE_WORDS[: shape[0]], dtype=torch.int32)
            got = _forward_backward(
                lambda *a: masked(fused, columns, *a), x.to(device), words.to(device), layer, threshold, scale
            )
            want = _forward_backward(reference, x, words, layer, threshold, scale)
            if not all(torch.equal(a.cpu(), b) for a, b in zip(got, want, strict=True)):
                log.warning(
                    "layout-free dropout: the compiled kernel on %s differs from the eager one on the CPU for %s; "
                    "using eager",
                    device,
                    dtype,
                )
                return None
    except Exception as error:
        log.warning(
            "layout-free dropout: no compiled kernel on %s for %s (%s); using eager", device, dtype, _say(error)
        )
        return None
    return fused


def _forward_backward(
    kernel: Eager, x: torch.Tensor, words: torch.Tensor, layer: int, threshold: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_(True)
    out = kernel(x, words, layer, threshold, scale)
    weights = torch.linspace(-2.0, 3.0, x.numel(), dtype=x.dtype).reshape(x.shape).to(x.device)
    (grad,) = torch.autograd.grad(out, x, weights)
    return out.detach(), grad


def _say(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
