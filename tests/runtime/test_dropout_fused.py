"""The compiled dropout kernel (inductor's C++ backend here; triton on CUDA) equals the eager path bit for bit.

Compiling takes seconds, so the CPU comparisons share one compiled kernel per dtype. On CUDA (``gpu``
marker) the same comparisons run against the CPU, which is what makes a GPU rank agree with a CPU rank.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from worker_agent.runtime.numerics import dropout_fused
from worker_agent.runtime.numerics.dropout import (
    Masks,
    apply_dropout,
    eager_kernel,
    element_words,
    fused_kernel,
    keep_mask,
)

IDS = torch.tensor([5, 0, 2**33 + 7, 11, -1, 3, 40])  # -1: the runtime pads short micro-batches with it
MASKS = Masks()  # as a trainer process keeps one: the comparisons share its compiled kernels


def _run(x: torch.Tensor, splits: list[int], p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout of ``x`` (its samples are ``IDS``) in micro-batches of ``splits``; the output and ``x``'s gradient."""
    x = x.detach().requires_grad_(True)
    parts, start = [], 0
    for size in splits:
        ids = IDS[start : start + size].to(x.device)
        parts.append(apply_dropout(x[start : start + size], ids, 9, 4, 77, p, MASKS))
        start += size
    out = torch.cat(parts)
    weights = torch.linspace(-2.0, 3.0, out.numel(), dtype=x.dtype, device=x.device).reshape(out.shape)
    out.backward(weights)  # type: ignore[no-untyped-call]
    assert x.grad is not None
    return out.detach().cpu(), x.grad.cpu()


def _compare(device: torch.device, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        ((7, 5, 9), [7], 0.1),
        ((7, 5, 9), [3, 4], 0.1),
        ((7, 5, 9), [1, 6], 0.1),
        ((7, 3, 2, 5), [2, 2, 3], 0.5),
        ((7, 13), [7], 0.9),
    ]
    for shape, splits, p in cases:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)
        monkeypatch.setenv(dropout_fused.ENV, "off")
        want = _run(x, [7], p)  # eager, on the CPU, one micro-batch
        monkeypatch.setenv(dropout_fused.ENV, "on")
        got = _run(x.to(device), splits, p)
        assert torch.equal(got[0], want[0]), (shape, splits, p, dtype)
        assert torch.equal(got[1], want[1]), (shape, splits, p, dtype)
    assert MASKS.kernels.verdicts[(device.type, device.index, dtype)] is not None  # the compiled kernel ran


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_masks_outputs_and_gradients_equal_eager_ones_in_any_micro_batches(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    _compare(torch.device("cpu"), dtype, monkeypatch)


@pytest.mark.slow
def test_a_kernel_that_differs_from_the_reference_is_refused_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    def doubled(x: torch.Tensor, words: torch.Tensor, layer: int, threshold: int, scale: float) -> torch.Tensor:
        return eager_kernel(x, words, layer, threshold, scale) * 2

    with caplog.at_level(logging.WARNING, logger=dropout_fused.__name__):
        fused = dropout_fused.compile_kernel(fused_kernel)
        assert dropout_fused.check(fused, doubled, element_words, torch.device("cpu"), torch.float32) is None
    assert [r.getMessage() for r in caplog.records] == [
        "layout-free dropout: the compiled kernel on cpu differs from the eager one on the CPU for torch.float32; "
        "using eager"
    ]


def test_a_kernel_that_cannot_be_compiled_leaves_dropout_eager_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def untraceable(
        x: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor, threshold: int, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if x.sum().item() > 1e30:  # data-dependent control flow: fullgraph compilation refuses it
            return x, x
        return fused_kernel(x, rows, columns, threshold, scale)

    with caplog.at_level(logging.WARNING, logger=dropout_fused.__name__):
        fused = dropout_fused.compile_kernel(untraceable)
        assert dropout_fused.check(fused, eager_kernel, element_words, torch.device("cpu"), torch.float32) is None
    (record,) = caplog.records
    assert record.getMessage().startswith("layout-free dropout: no compiled kernel on cpu for torch.float32 (")


def test_compilation_is_wanted_on_cuda_only_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(2, 3)
    assert not dropout_fused.wanted(x, 3, "auto")  # a CPU activation: eager unless "on"
    assert dropout_fused.wanted(x, 3, "on") and not dropout_fused.wanted(x, 3, "off")
    assert not dropout_fused.wanted(x, 1 << 31, "on")  # element indices past int32: eager only
    monkeypatch.setenv(dropout_fused.ENV, "yes")
    with pytest.raises(ValueError, match="SPOTMORPH_DROPOUT_COMPILE='yes' is not one of auto, on, off"):
        apply_dropout(x, torch.tensor([0, 1]), 0, 0, 0, 0.5, Masks())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu on a GPU machine)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_compiled_and_eager_dropout_equal_the_cpu_bit_for_bit(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    _compare(torch.device("cuda", 0), dtype, monkeypatch)
    x = torch.randn(7, 5, 9).to(dtype)
    monkeypatch.setenv(dropout_fused.ENV, "off")
    assert torch.equal(_run(x.cuda(), [3, 4], 0.3)[0], _run(x, [7], 0.3)[0])  # the eager path on CUDA too
    assert torch.equal(keep_mask(x.shape, IDS.cuda(), 9, 4, 77, 0.3).cpu(), keep_mask(x.shape, IDS, 9, 4, 77, 0.3))


@pytest.mark.slow
def test_a_bad_compile_setting_stops_spotmorph_train_at_start_up_with_exit_2(tmp_path: Path) -> None:
    """Checked when the kernel is warmed up, before the rendezvous, rather than in the first step."""
    import os
    import subprocess

    from tests.runtime.helpers import train_cmd

    env = {**os.environ, dropout_fused.ENV: "bogus"}
    result = subprocess.run(train_cmd(tmp_path / "c", 1, 1, 2), capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result
    assert f"{dropout_fused.ENV}='bogus' is not one of auto, on, off" in result.stderr
    assert "Traceback" not in result.stderr


def test_dropout_is_warmed_up_only_for_models_that_drop_out_in_the_dtypes_they_compute_in() -> None:
    from examples.tiny_gpt import build_config
    from worker_agent.runtime.model.model_api import dropout_dtypes

    with_dropout, without = (
        build_config(d_model=16, blocks=1, seq_len=8),
        build_config(d_model=16, blocks=1, seq_len=8, dropout=0.0),
    )
    assert dropout_dtypes(with_dropout, torch.float32, torch.bfloat16) == (torch.float32, torch.bfloat16)
    assert dropout_dtypes(with_dropout, torch.float64, None) == (torch.float64,)
    assert dropout_dtypes(without, torch.float32, torch.bfloat16) == ()


@pytest.mark.slow
def test_the_compiled_kernel_under_recomputation_equals_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recomputation (non-reentrant checkpoint) stops its re-run early by raising from the saved-tensor hook,
    here inside the compiled kernel's ``save_for_backward``: that is control flow, not a failed kernel, so it
    must pass through (caught, it left the checkpoint's state broken and the kernel eager; seen on an H200)."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(5)
    lin1, lin2 = torch.nn.Linear(9, 9), torch.nn.Linear(9, 9)

    def block(x: torch.Tensor) -> torch.Tensor:  # dropout last: its save is where the re-run stops
        return apply_dropout(lin2(lin1(x)), IDS, 9, 4, 77, 0.3, MASKS)

    x = torch.randn(7, 9, generator=torch.Generator().manual_seed(3))
    grads = []
    for mode in ("off", "on"):
        monkeypatch.setenv(dropout_fused.ENV, mode)
        lin1.zero_grad()
        lin2.zero_grad()
        checkpoint(block, x, use_reentrant=False).sum().backward()
        grads.append([p.grad.clone() for p in (*lin1.parameters(), *lin2.parameters()) if p.grad is not None])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    assert MASKS.kernels.verdicts[("cpu", None, torch.float32)] is not None  # still compiled
