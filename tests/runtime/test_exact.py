"""Issue 23, exact mode: fixed-point gradient sums that no order changes, and training that ends with the
same bits in any chain of layouts (fp32 and bf16, B not divisible by D); tests/runtime/test_checkpoint_diff.py
shows the normal mode does not."""

from __future__ import annotations

import itertools
import math
import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from morphing.errors import UserInputError
from morphing.jobspec import JobSpec
from morphing.layout import InvalidLayout, even_partition, make_layout, share_of, unit_shares
from tests.runtime.helpers import TINY, Result, run, train_cmd
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.partition import PartitionedModel
from worker_agent.runtime.numerics.exact import LIMB, limbs, to_float

FLOATS = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(FLOATS, min_size=3, max_size=3), min_size=1, max_size=12), st.randoms())
def test_limb_sums_are_the_same_in_any_order_and_close_to_the_exact_sum(
    rows: list[list[float]], shuffle: random.Random
) -> None:
    grads = [torch.tensor(row, dtype=torch.float32) for row in rows]
    forward = sum((limbs(g, "g") for g in grads), torch.zeros(3, 3, dtype=torch.float64))
    reordered = list(grads)
    shuffle.shuffle(reordered)
    backward = sum((limbs(g, "g") for g in reordered), torch.zeros(3, 3, dtype=torch.float64))
    assert torch.equal(forward, backward)
    got = to_float(forward, torch.float64).tolist()
    for column in range(3):
        exact = math.fsum(row[column] for row in rows)  # float32 inputs, whole parts below 2^40: nothing truncated
        assert abs(got[column] - exact) <= 4 * math.ulp(exact) + len(rows) * 2.0**-80


def test_a_value_is_split_exactly_and_one_too_large_or_not_finite_is_the_users_error() -> None:
    values = torch.tensor([3.0, -2.5, 1e-10, -123456.789, 2.0**-70], dtype=torch.float32)  # no bit below 2^-80
    assert torch.equal(to_float(limbs(values, "w"), torch.float32), values)
    tiny = torch.tensor([1e-20], dtype=torch.float32)  # bits down to 2^-90: those below 2^-80 are dropped
    assert abs(float(to_float(limbs(tiny, "w"), torch.float64)) - float(tiny)) < 2.0**-80
    for bad in (LIMB, float("inf"), float("nan")):
        with pytest.raises(UserInputError, match=r"exact mode: a gradient of block0\.w is"):
            limbs(torch.tensor([1.0, bad]), "block0.w")


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 200), st.integers(1, 16), st.integers(1, 16))
def test_unit_shares_cut_only_between_micro_batches_and_cover_the_batch(batch: int, m: int, replicas: int) -> None:
    units = -(-batch // m)
    if replicas > units:
        with pytest.raises(InvalidLayout, match="each replica needs a micro-batch"):
            unit_shares(batch, m, replicas)
        return
    shares = unit_shares(batch, m, replicas)
    assert shares[0][0] == 0 and shares[-1][1] == batch and len(shares) == replicas
    for (_, stop), (start, _) in itertools.pairwise(shares):
        assert stop == start and start % m == 0
    counts = [-(-(stop - start) // m) for start, stop in shares]
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1


def test_an_exact_job_runs_only_in_a_layout_of_its_own_micro_batch_size() -> None:
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=2, micro_batch_size=2, global_batch=7)
    assert share_of(layout, 1, exact_micro_batch=2) == (4, 7) and share_of(layout, 1) == layout.replica_slice(1)
    with pytest.raises(InvalidLayout, match="the layout's micro-batch size is 2, the job's 4"):
        share_of(layout, 0, exact_micro_batch=4)


def test_the_job_spec_asks_exact_mode_for_a_micro_batch_size_and_names_it_in_the_identity() -> None:
    base = {"name": "j", "entrypoint": "m.py:f", "global_batch": 7, "steps": 1, "checkpoint_dir": "/c"}
    with pytest.raises(ValueError, match="set micro_batch_size"):
        JobSpec.model_validate({**base, "exact": True})
    with pytest.raises(ValueError, match="fp32 or bf16"):
        JobSpec.model_validate({**base, "exact": True, "micro_batch_size": 2, "precision": "fp16"})
    normal = JobSpec.model_validate({**base, "micro_batch_size": 2})
    assert set(normal.identity()) == {"entrypoint", "global_batch", "seed", "dtype"}  # old hashes keep their bytes
    exact = JobSpec.model_validate({**base, "exact": True, "micro_batch_size": 2})
    assert exact.identity() == {**normal.identity(), "exact": True, "micro_batch_size": 2}
    assert exact.identity_hash() != normal.identity_hash()


def test_untied_layers_each_have_their_own_copy_kept_equal_to_the_parameter() -> None:
    spec = build_spec(TINY, 0)
    model = PartitionedModel(spec, untie=True)
    embed, head = model.layer_names.index("embed"), model.layer_names.index("head")
    (name,) = [n for n, info in model.params.items() if len(info.layers) > 1]
    assert model.leaf(name, embed) is model.tensors[name] and model.leaf(name, head) is not model.tensors[name]
    assert spec.layers[head][1].get_parameter("out.weight") is model.leaf(name, head)  # the head uses its copy
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=2, global_batch=7)
    assert len(model.stage_leaves(layout, 0)) == len(model.stage_params(layout, 0)) + 1
    with torch.no_grad():
        model.tensors[name].add_(1.0)
    model.sync_copies(layout, 0)
    assert torch.equal(model.leaf(name, head), model.tensors[name])
    two = make_layout(num_layers=4, pipeline_stages=2, data_parallel=1, micro_batch_size=2, global_batch=7)
    assert dict(model.stage_params(two, 1))[name] is model.leaf(name, head)  # the last stage holds the copy
    assert even_partition(4, 2) == two.stage_layers


def exact_train(ckpt: Path, stages: int, replicas: int, steps: int, *extra: str, entry: str = TINY) -> None:
    """B = 7 and m = 2 (train_cmd's): four micro-batches a step, the last one short."""
    extra = ("--dtype=float32", "--exact", "--log-every=25", *extra)
    result = run(train_cmd(ckpt, stages, replicas, steps, *extra, entrypoint=entry), timeout=300)
    assert result.returncode == 0, result.explain()


def bitwise(a: Path, b: Path) -> Result:
    return run([sys.executable, "-m", "spotmorph.cli", "checkpoint", "diff", str(a), str(b), "--bitwise"])


# 24 steps: a float sum that depended on the layout would differ in its bits from the first step on.
CHAIN = ((1, 1, 6), (2, 2, 12), (3, 1, 18), (1, 3, 24))


def exact_chain_equals_one_process(tmp_path: Path, precision: str, entry: str = TINY) -> None:
    """A chain 1x1 -> 2x2 -> 3x1 -> 1x3 (stop and resume between legs) against an uninterrupted 1x1 run."""
    extra = (f"--precision={precision}",)
    exact_train(tmp_path / "reference", 1, 1, CHAIN[-1][2], *extra, entry=entry)
    for stages, replicas, until in CHAIN:
        exact_train(tmp_path / "chain", stages, replicas, until, *extra, entry=entry)
    verdict = bitwise(tmp_path / "reference", tmp_path / "chain")
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "bitwise equal" in verdict.stdout and f"(step {CHAIN[-1][2]})" in verdict.stdout


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_exact_chain_of_layouts_ends_bitwise_where_one_process_does(tmp_path: Path, precision: str) -> None:
    exact_chain_equals_one_process(tmp_path, precision)
