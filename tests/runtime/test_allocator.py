"""Trainers keep the memory a step frees for the next step (:mod:`worker_agent.runtime.process.allocator`).

In processes of their own (malloc's settings are the process's): a training loop whose tensors are larger
than glibc's mmap threshold faults its memory in every step with glibc's defaults, and not at all once the
first steps have run with the trainer's settings; a bad setting is the node's error, exit 2, named.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tests.runtime.helpers import probe, run, train_cmd

LOOP = """
import json, resource, sys
from worker_agent.runtime.process.allocator import keep_freed_memory
tuned = keep_freed_memory()
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048))  # 32 MB each
optimizer = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 2048)
faults = []
for step in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"tuned": tuned, "faults": faults, "checksum": float(sum(p.sum() for p in model.parameters()))}))
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator's knobs are glibc's")


def loop(monkeypatch: pytest.MonkeyPatch, mode: str) -> dict[str, object]:
    monkeypatch.setenv("SPOTMORPH_MALLOC", mode)
    return probe(LOOP, new_interpreter=True)


@glibc
@pytest.mark.soak  # make soak: a measurement of page faults; make test keeps the allocator's settings tests
def test_a_step_reuses_the_memory_the_last_one_freed_where_the_system_default_faults_it_in_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept, system = loop(monkeypatch, "keep"), loop(monkeypatch, "system")
    assert kept["tuned"] is True and system["tuned"] is False
    kept_faults, system_faults = kept["faults"], system["faults"]
    assert isinstance(kept_faults, list) and isinstance(system_faults, list)
    page_faults_per_step = 32 * (1 << 20) // 4096  # one 32 MB tensor's pages
    assert min(system_faults[2:]) > page_faults_per_step, f"glibc's default unmaps large frees: {system_faults}"
    assert sum(kept_faults[2:]) < sum(system_faults[2:]) / 5, f"kept {kept_faults}, system {system_faults}"
    assert kept["checksum"] == system["checksum"], "where the memory comes from changes no number"


@pytest.mark.slow
def test_a_bad_setting_is_the_nodes_error_exit_2_named_with_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOTMORPH_MALLOC", "jemalloc")
    result = run(train_cmd(tmp_path / "ckpt", 1, 1, 1))
    assert result.returncode == 2, result.explain()
    assert "SPOTMORPH_MALLOC='jemalloc' on this node is not one of keep, system; unset it" in result.stderr


BIG = """
import torch
from torch import nn
from worker_agent.runtime.model.model_api import ModelSpec


def build():
    data = [(torch.zeros(1024), torch.zeros(1024)) for _ in range(8)]
    return ModelSpec(
        layers=[("a", nn.Linear(1024, 1024)), ("b", nn.Linear(1024, 1024))],  # 8 MB of parameters
        loss=lambda out, target: ((out - target) ** 2).sum(-1),
        dataset=data,
        optimizer=lambda params: torch.optim.AdamW([p for _, p in params]),
        lr_schedule=lambda step: 1.0,
    )
"""

PREPARED = """
import json, resource, sys
from worker_agent.runtime.process.allocator import keep_freed_memory
keeps = keep_freed_memory()
import torch
from morphing.jobspec import JobSpec
from worker_agent.runtime.process import warm_model

job = JobSpec(name="big", entrypoint=sys.argv[1], global_batch=4, steps=1, checkpoint_dir="unused", device="cpu")
shelf = warm_model.ModelShelf()
shelf.prepare(job, touch=keeps)
parameter_bytes = sum(t.numel() * t.element_size() for t in shelf.built.model.tensors.values())
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
landed = [torch.ones(parameter_bytes // 4 // 16) for _ in range(3 * 16)]  # moved parameters and two moments
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, "bytes": 3 * parameter_bytes}))
"""


@pytest.mark.slow
@glibc
def test_a_prepared_warm_trainer_has_the_memory_a_growths_moves_land_in_already_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = tmp_path / "big.py"
    entry.write_text(BIG)
    touched = probe(PREPARED, f"{entry}:build", new_interpreter=True)
    monkeypatch.setenv("SPOTMORPH_MALLOC", "system")  # freed memory goes back: nothing is kept touched
    fresh = probe(PREPARED, f"{entry}:build", new_interpreter=True)
    pages = fresh["bytes"] // 4096
    assert fresh["faults"] > pages // 2, fresh
    assert touched["faults"] < pages // 20, f"touched {touched}, fresh {fresh}"


def test_a_warm_trainer_touches_at_most_half_the_memory_the_node_has_free(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker_agent.runtime.process import warm_model

    sizes = {"SC_AVPHYS_PAGES": 2048, "SC_PAGE_SIZE": 4096}  # 8 MB free
    monkeypatch.setattr("worker_agent.runtime.process.warm_model.os.sysconf", lambda name: sizes[name])
    assert warm_model.touch_memory(1 << 40) == 4 << 20, "a 7B model's 4x would be 112 GB: half of what is free"
    assert warm_model.touch_memory(1 << 20) == 1 << 20

    def unknown(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr("worker_agent.runtime.process.warm_model.os.sysconf", unknown)
    assert warm_model.touch_memory(1 << 20) == 0, "nothing touched where the free memory cannot be read"
