"""The runtime's own pipeline (:mod:`worker_agent.runtime.pipeline.pipeline_stage`, :mod:`.schedule`).

Real gloo processes, one per stage, train a model whose stage boundaries carry a tuple of three tensors (a float one
with gradients, token ids, and a float one no parameter made): GPipe and 1F1B over two and three stages end bitwise
where one stage ends (losses, evaluation and parameters after two steps), and each layer runs one forward per micro-
batch from the first step on (no forward that infers the boundary). A layer whose output changes shape from one
micro-batch to the next gets an error that says so.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from morphing.errors import UserInputError
from tests.runtime.helpers import probe
from worker_agent.runtime.pipeline.pipeline_stage import DTYPES, Boundary

PROBE = r"""
import json, os, sys, tempfile, traceback
from datetime import timedelta
import torch, torch.distributed as dist
from torch import nn
from worker_agent.runtime.pipeline.pipeline_stage import Batch, Stage
from worker_agent.runtime.pipeline.schedule import Schedule

stages, kind, n_micro, scenario = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
M, STEPS = 2, 2
CUTS = {1: [(0, 4)], 2: [(0, 2), (2, 4)], 3: [(0, 1), (1, 3), (3, 4)]}[stages]


class Counted(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, *x):
        self.calls += 1
        out = self.inner(*x)
        if scenario == "ragged" and self.calls == 2 and isinstance(out, tuple):
            return (out[0][:-1], *out[1:])
        return out


class Split(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6, dtype=torch.float64)

    def forward(self, x):
        return torch.tanh(self.lin(x)), (x[:, 0] > 0).long(), torch.full((x.shape[0], 6), 0.5, dtype=torch.float64)


class Mix(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6, dtype=torch.float64)

    def forward(self, h, ids, mask):
        return torch.tanh(self.lin(h)) * mask + ids[:, None], ids, mask


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 1, dtype=torch.float64)

    def forward(self, h, ids, mask):
        return self.lin(h * mask).squeeze(-1)


class Chain(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, *x):
        for layer in self.layers:
            x = layer(*x) if isinstance(x, tuple) else layer(x)
        return x


def rank_main(rank, store_path, out):
    store = dist.FileStore(store_path, stages)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=stages, timeout=timedelta(seconds=20))
    torch.manual_seed(0)
    layers = [Counted(m) for m in (Split(), Mix(), Mix(), Head())]
    first, last = CUTS[rank]
    batch = Batch()
    batch.micro_batch_size = M
    batch.sample_ids = torch.arange(n_micro * M)
    stage = Stage(Chain(layers[first:last]), rank, stages, dist.group.WORLD, torch.device("cpu"), batch, 7, None)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n_micro * M, 4, generator=g, dtype=torch.float64)
    y = torch.randn(n_micro * M, generator=g, dtype=torch.float64)
    schedule = Schedule(stage, n_micro, lambda output, slots: ((output - y[slots]) ** 2).sum(), kind)
    params = [p for layer in layers[first:last] for p in layer.parameters()]
    losses, calls = [], []
    try:
        for step in range(STEPS):
            batch.step = step
            found = []
            args = (x,) if rank == 0 else ()
            schedule.step(*args, target=torch.arange(n_micro * M) if rank == stages - 1 else None, losses=found)
            losses.append([float(v) for v in found])
            with torch.no_grad():
                for p in params:
                    p -= 0.1 * p.grad
                    p.grad = None
            calls.append([layers[i].calls for i in range(first, last)])
        evaluated = []
        with torch.no_grad():
            schedule.eval(*args, target=torch.arange(n_micro * M) if rank == stages - 1 else None, losses=evaluated)
        result = {
            "layers": {str(i): [p.tolist() for p in layers[i].parameters()] for i in range(first, last)},
            "losses": losses if rank == stages - 1 else [],
            "eval": [float(v) for v in evaluated],
            "calls": calls,
        }
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    with open(out, "w") as f:
        json.dump(result, f)


folder = tempfile.mkdtemp()
children = []
for rank in range(stages):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            rank_main(rank, os.path.join(folder, "store"), os.path.join(folder, f"{rank}.json"))
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
ranks = []
for rank in range(stages):
    path = os.path.join(folder, f"{rank}.json")
    ranks.append(json.load(open(path)) if os.path.exists(path) else {"error": "no result"})
print(json.dumps({"ranks": ranks}))
"""


def run_pipeline(stages: int, kind: str, n_micro: int, scenario: str = "plain") -> list[dict[str, Any]]:
    found = probe(PROBE, str(stages), kind, str(n_micro), scenario)
    ranks: list[dict[str, Any]] = found["ranks"]
    return ranks


def merged(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    for rank in ranks:
        assert "error" not in rank, ranks
    return {
        "layers": {k: v for rank in ranks for k, v in rank["layers"].items()},
        "losses": ranks[-1]["losses"],
        "eval": ranks[-1]["eval"],
    }


@pytest.mark.parametrize(("stages", "kind"), [(2, "gpipe"), (2, "1f1b"), (3, "1f1b"), (3, "gpipe")])
def test_every_schedule_and_cut_ends_bitwise_where_one_stage_ends(stages: int, kind: str) -> None:
    one = run_pipeline(1, "gpipe", 4)
    cut = run_pipeline(stages, kind, 4)
    assert merged(cut) == merged(one)
    assert len(merged(one)["losses"]) == 2 and all(len(step) == 4 for step in merged(one)["losses"])
    for rank in cut:
        assert rank["calls"] == [[4] * len(rank["calls"][0]), [8] * len(rank["calls"][0])], "one forward a micro-batch"


def test_an_output_that_changes_shape_between_micro_batches_is_refused_with_the_fix() -> None:
    ranks = run_pipeline(2, "1f1b", 4, "ragged")
    error = ranks[0].get("error", "")
    assert "UserInputError" in error and "keep its shapes and dtypes" in error, ranks


@given(
    st.lists(
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 1 << 40), max_size=5).map(tuple)),
        min_size=1,
        max_size=6,
    )
)
def test_a_boundary_header_decodes_to_what_was_encoded(tensors: list[tuple[torch.dtype, tuple[int, ...]]]) -> None:
    boundary = Boundary(tuple(tensors))
    assert Boundary.decode(boundary.encode()) == boundary


def test_a_stage_that_ends_in_something_not_a_tensor_is_told_what_to_return() -> None:
    with pytest.raises(UserInputError, match="must return a tensor or a tuple of tensors"):
        Boundary.of((torch.zeros(2), None), stage=1)
    with pytest.raises(UserInputError, match="complex"):
        Boundary.of((torch.zeros(2, dtype=torch.complex64),), stage=0)
