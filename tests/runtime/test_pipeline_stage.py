"""A one-stage pipeline runs no extra forward on its first step (:mod:`worker_agent.runtime.pipeline.pipeline_stage`).

``torch.distributed.pipelining``, which the runtime used before its own pipeline, inferred a stage's tensors by
running it once more on the first micro-batch. A real 1x1 :class:`StageRunner` (gloo, one process) with a
layer that counts its calls runs exactly one forward per micro-batch from the first step on, for token ids
and for float inputs (a tuple of two, cast to the job's dtype). (Several stages: tests/runtime/test_schedule.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime.helpers import REPO, probe

MODELS = """
import sys
sys.path.insert(0, {examples!r})
import torch
from torch import nn
import tiny_gpt
from worker_agent.runtime.model.model_api import ModelSpec


class Counting(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, *x):
        self.calls += 1
        return self.inner(*x)


def tokens():
    spec = tiny_gpt.build_tiny()
    layers = [(n, Counting(m) if i == 0 else m) for i, (n, m) in enumerate(spec.layers)]
    return type(spec)(**{{**spec.__dict__, "layers": layers}})


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(5, 4)

    def forward(self, x, y):
        return torch.tanh(self.a(x) + self.b(y))


def floats():
    g = torch.Generator().manual_seed(0)
    data = [
        ((torch.randn(3, generator=g), torch.randn(5, generator=g)), torch.randn(2, generator=g)) for _ in range(64)
    ]
    return ModelSpec(
        layers=[("pair", Counting(Pair())), ("head", nn.Linear(4, 2))],
        loss=lambda out, target: ((out - target) ** 2).sum(-1),
        dataset=data,
        optimizer=lambda params: torch.optim.SGD([p for _, p in params], lr=0.1),
        lr_schedule=lambda step: 1.0,
    )
"""

PROBE = """
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from worker_agent.runtime.pipeline.comm import Communicators, make_groups
from worker_agent.runtime.pipeline.engine import StageRunner
from worker_agent.runtime.process.warm_model import build

entry, dtype = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
torch.set_num_threads(1)
cpu = torch.device("cpu")
job = JobSpec(name="probe", entrypoint=entry, global_batch=6, steps=3, checkpoint_dir="unused", device="cpu",
              dtype=dtype)
model = build(job)
layout = make_layout(num_layers=len(model.layer_names), pipeline_stages=1, data_parallel=1, micro_batch_size=2,
                     global_batch=6)
runner = StageRunner(job, layout, 0, model, make_groups(layout, model, 0, cpu, 60.0, Communicators()))
counter = model.modules[0]
counter.calls = 0  # the start-up checks ran the layer too
calls = []
for step in range(3):
    runner.run_step(step)
    calls.append(counter.calls)
print(json.dumps({"calls": calls, "params": {n: t.double().sum().item() for n, t in model.tensors.items()}}))
"""


@pytest.mark.parametrize(("model", "dtype"), [("tokens", "float32"), ("floats", "float64")])
def test_the_first_step_of_a_one_stage_pipeline_runs_one_forward_a_micro_batch(
    tmp_path: Path, model: str, dtype: str
) -> None:
    entry = tmp_path / "models.py"
    entry.write_text(MODELS.format(examples=str(REPO / "examples")))
    found = probe(PROBE, f"{entry}:{model}", dtype)
    assert found["calls"] == [3, 6, 9], "three micro-batches a step, and nothing more"
    assert all(value == value for value in found["params"].values()), "it trained to numbers"
