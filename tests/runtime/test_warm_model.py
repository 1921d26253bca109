"""A held trainer's next generation starts on the model it built: what it keeps and what it puts right.

A real 1x1 stage (gloo, one process): the model trains two steps, a buffer is replaced and a gradient is left
behind (as a step that failed in a collective leaves one); the next generation of the same job gets the same
model back with the buffer as built and no gradient, a generation with nothing to resume from gets the
initial weights of a fresh build, and another job gets a model of its own.
"""

from __future__ import annotations

from pathlib import Path

from tests.runtime.helpers import REPO, probe

MODEL = '''
import sys
sys.path.insert(0, {examples!r})
import torch
from torch import nn
import tiny_gpt


class Counting(nn.Module):
    """A block with a buffer its forward moves (a running statistic that never changes the output)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = self.calls + 1  # a new tensor in the buffer's name, not an update of the one built
        return self.inner(x)


def build():
    spec = tiny_gpt.build_tiny()
    layers = [(n, Counting(m) if n == "block0" else m) for n, m in spec.layers]
    return type(spec)(**{{**spec.__dict__, "layers": layers}})
'''

PROBE = """
import json, sys
from datetime import timedelta
import torch, torch.distributed as dist
from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from worker_agent.runtime.process import warm_model
from worker_agent.runtime.pipeline.comm import Communicators, make_groups
from worker_agent.runtime.pipeline.engine import StageRunner

entry, ckpt = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
torch.set_num_threads(1)
cpu = torch.device("cpu")
job = JobSpec(name="probe", entrypoint=entry, global_batch=4, steps=3, checkpoint_dir=ckpt, device="cpu")


def runner_of(model):
    layout = make_layout(num_layers=len(model.layer_names), pipeline_stages=1, data_parallel=1,
                         micro_batch_size=2, global_batch=4)
    return layout, StageRunner(job, layout, 0, model, make_groups(layout, model, 0, cpu, 60.0, Communicators()))


layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=2, global_batch=4)
shelf = warm_model.ModelShelf()
first, reused_first = shelf.model_for(job, layout, cpu)
initial = {n: t.detach().clone() for n, t in first.tensors.items()}
_, runner = runner_of(first)
runner.run_step(0)
runner.run_step(1)
moved = float(first.modules[1].calls)
trained = {n: t.detach().clone() for n, t in first.tensors.items()}
next(iter(first.tensors.values())).grad = torch.ones_like(next(iter(first.tensors.values())))
again, reused_again = shelf.model_for(job, layout, cpu)
_, runner = runner_of(again)
warm_model.initial_weights(job, runner)
other_job = job.model_copy(update={"seed": job.seed + 1})
other, reused_other = shelf.model_for(other_job, layout, cpu)
print(json.dumps({
    "reused": [reused_first, reused_again, reused_other],
    "same_object": again is first,
    "other_object": other is not first,
    "buffer_moved": moved,
    "buffer_now": float(again.modules[1].calls),
    "grads_left": [n for n, t in again.tensors.items() if t.grad is not None],
    "trained_differs": any(not torch.equal(trained[n], initial[n]) for n in initial),
    "initial_again": all(torch.equal(dict(runner.params)[n], initial[n]) for n, _ in runner.params),
}))
"""


def test_the_next_generation_of_a_held_trainer_reuses_its_model_and_puts_right_what_a_build_would(
    tmp_path: Path,
) -> None:
    entry = tmp_path / "counting.py"
    entry.write_text(MODEL.format(examples=str(REPO / "examples")))
    found = probe(PROBE, f"{entry}:build", str(tmp_path / "ckpt"))
    assert found["reused"] == [False, True, False]
    assert found["same_object"] and found["other_object"]
    assert found["buffer_moved"] > 0 and found["buffer_now"] == 0.0
    assert found["grads_left"] == []
    assert found["trained_differs"] and found["initial_again"]


PREPARE_PROBE = """
import json, sys
import torch
from morphing.jobspec import JobSpec
from morphing.layout import make_layout
from worker_agent.runtime.process import warm_model

entry, ckpt = sys.argv[1], sys.argv[2]
cpu = torch.device("cpu")
job = JobSpec(name="probe", entrypoint=entry, global_batch=4, steps=3, checkpoint_dir=ckpt, device="cpu")
layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=2, global_batch=4)
shelf = warm_model.ModelShelf()
on_gpu = shelf.prepare(job.model_copy(update={"device": "cuda"}), touch=False)
built, again = shelf.prepare(job, touch=False), shelf.prepare(job, touch=False)
prebuilt = shelf.built.model
first, trained_first = shelf.model_for(job, layout, cpu)
second, trained_second = shelf.model_for(job, layout, cpu)
fresh = warm_model.build(job)
print(json.dumps({
    "prepared": [on_gpu, built, again],
    "same_object": first is prebuilt and second is prebuilt,
    "trained": [trained_first, trained_second],
    "initial": all(torch.equal(t, fresh.tensors[n]) for n, t in first.tensors.items()),
}))
"""


def test_a_model_prepared_ahead_is_the_one_the_first_generation_gets_with_its_initial_weights(tmp_path: Path) -> None:
    """A free node's hint (:meth:`warm_model.ModelShelf.prepare`): built once, CPU jobs only, handed to the
    generation that comes as untrained (it needs no initial weights put back), and as trained to the one after it."""
    entry = tmp_path / "counting.py"
    entry.write_text(MODEL.format(examples=str(REPO / "examples")))
    found = probe(PREPARE_PROBE, f"{entry}:build", str(tmp_path / "ckpt"))
    assert found["prepared"] == [False, True, False]
    assert found["same_object"] and found["initial"]
    assert found["trained"] == [False, True]
