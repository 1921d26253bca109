"""The step's work on the device without waiting for the host: the gradients' norm and scaling fused per dtype,
a profile asked for in the environment (``SPOTMORPH_PROFILE_STEPS``) and exact mode's refusal of an op with no
deterministic kernel. The GPU's own count of host waits is in tests/runtime/test_gpu.py."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from morphing.errors import UserInputError
from tests.runtime.helpers import run, train_cmd
from worker_agent.runtime.numerics.exact import deterministic_or_refused
from worker_agent.runtime.numerics.stage_state import scale_in_place, squared_norm
from worker_agent.runtime.profiling.step_profile import ProfileRequest, count_host_waits, parse_request

DTYPES = (torch.float64, torch.float32, torch.bfloat16)


@st.composite
def gradients(draw: st.DrawFn) -> list[torch.Tensor]:
    out = []
    for _ in range(draw(st.integers(0, 5))):
        size = draw(st.integers(1, 40))
        values = draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=size, max_size=size))
        out.append(torch.tensor(values, dtype=draw(st.sampled_from(DTYPES))))
    return out


@settings(max_examples=60, deadline=None)
@given(gradients())
def test_the_fused_norm_is_the_float64_sum_of_squares(grads: list[torch.Tensor]) -> None:
    reference = math.fsum(float(v) ** 2 for g in grads for v in g.double().tolist())
    got = float(squared_norm(grads, torch.device("cpu")))
    assert got == pytest.approx(reference, rel=1e-12, abs=1e-300)


@settings(max_examples=60, deadline=None)
@given(gradients(), st.floats(1e-3, 2.0))
def test_scaling_by_a_device_scalar_equals_scaling_by_a_python_float(grads: list[torch.Tensor], coef: float) -> None:
    """What the clip did before (``grad.mul_(coef)`` when ``coef < 1``), bit for bit: a coefficient clamped to
    1 changes nothing, and a smaller one rounds as the Python float did."""
    expected = [g.clone().mul_(coef) if coef < 1.0 else g.clone() for g in grads]
    scale_in_place(grads, torch.tensor(coef, dtype=torch.float64).clamp(max=1.0))
    for got, want in zip(grads, expected, strict=True):
        assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize(
    ("env", "request_"),
    [
        ({}, None),
        ({"SPOTMORPH_PROFILE_STEPS": " "}, None),
        ({"SPOTMORPH_PROFILE_STEPS": "5:8"}, ProfileRequest(5, 8, Path("."))),
        ({"SPOTMORPH_PROFILE_STEPS": "1:2", "SPOTMORPH_PROFILE_DIR": "/x"}, ProfileRequest(1, 2, Path("/x"))),
    ],
)
def test_a_profile_is_asked_for_in_the_environment(env: dict[str, str], request_: ProfileRequest | None) -> None:
    assert parse_request(env) == request_


@pytest.mark.parametrize("bad", ["5", "8:5", "0:3", "a:b", "-1:3", "3:3", "1:2:3"])
def test_a_malformed_profile_request_names_the_variable_and_the_form(bad: str) -> None:
    with pytest.raises(UserInputError, match=r"SPOTMORPH_PROFILE_STEPS=.* is not A:B with 0 < A < B"):
        parse_request({"SPOTMORPH_PROFILE_STEPS": bad})


def test_host_waits_are_the_blocking_cuda_calls_only() -> None:
    names = ["cudaStreamSynchronize", "cudaMemcpyAsync", "aten::mm", "cudaStreamSynchronize", "cudaMemcpy"]
    assert count_host_waits(names) == {"cudaStreamSynchronize": 2, "cudaMemcpy": 1}


@pytest.mark.slow
def test_a_trainer_writes_its_profile_where_it_is_asked(tmp_path: Path) -> None:
    out = tmp_path / "profile"
    cmd = train_cmd(tmp_path / "ckpt", 2, 1, 5, "--checkpoint-interval=0")
    env = {**os.environ, "SPOTMORPH_PROFILE_STEPS": "2:4", "SPOTMORPH_PROFILE_DIR": str(out)}
    result = run(cmd, env=env)
    assert result.returncode == 0, result.explain()
    for rank in (0, 1):
        summary = json.loads((out / f"profile-rank{rank}.json").read_text())
        assert summary == {
            "steps": [2, 3],
            "host_waits": 0,
            "host_waits_per_step": 0.0,
            "host_waits_by_call": {},
            "device": "cpu",
        }
        assert "aten::" in (out / f"profile-rank{rank}.txt").read_text()


def test_a_bad_profile_request_fails_the_run_as_the_users_error(tmp_path: Path) -> None:
    result = run(train_cmd(tmp_path / "ckpt", 1, 1, 3), env={**os.environ, "SPOTMORPH_PROFILE_STEPS": "9:2"})
    assert result.returncode == 2, result.explain()
    assert "SPOTMORPH_PROFILE_STEPS='9:2' is not A:B" in result.stderr + result.stdout


def test_an_op_without_a_deterministic_kernel_is_refused_naming_it() -> None:
    """torch's words (``torch.use_deterministic_algorithms(True)`` meeting such an op on CUDA) become the
    user's error naming the op and the fix; any other RuntimeError passes through unchanged."""
    words = "scatter_add_cuda_kernel does not have a deterministic implementation, but you set 'torch.use_..."
    with (
        pytest.raises(
            UserInputError, match=r"exact mode: scatter_add_cuda_kernel has no deterministic kernel.*--exact"
        ),
        deterministic_or_refused(),
    ):
        raise RuntimeError(words)
    with pytest.raises(RuntimeError, match="CUDA out of memory"), deterministic_or_refused():
        raise RuntimeError("CUDA out of memory")
