"""On a machine with CUDA (``make test-gpu``, ``bench/gpu_check.sh``): a local-cluster job on a GPU through an
eviction with notice and back onto a GPU, equal to the CPU reference.

The VM's GPU is its own (``local up --gpus-per-node 1``); the job says ``device: auto``, so its trainer
trains on that GPU; the eviction frees the GPU and the added VM gets it back. Float64 makes the result
comparable with the CPU reference at 1e-9: the device and the morph are two more things it must not
depend on. Skipped with a reason without CUDA.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from spotmorph.local.processes import alive

from .test_elastic import BATCH, INTERVAL, SEED, STEPS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu on a GPU machine)"),
]


def _trainer_command_lines(cluster: LocalCluster) -> list[str]:
    lines = []
    for vm in cluster.vms():
        for pid_file in vm.work_dir.trainers.pid_files():
            pid = int(pid_file.read_text())
            if alive(pid):
                lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return lines


def _gpu_processes() -> str:
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(nvidia-smi: {exc})"


def test_a_gpu_job_through_an_eviction_and_back_equals_the_cpu_reference(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=1, slots=1, gpus_per_node=1)
    gpus = [g for n in cluster.nodes() for g in n.get("gpus", [])]
    assert gpus, f"the node reports no GPU: {cluster.nodes()}"
    checkpoints = tmp_path / "ckpt"
    job = cluster.submit(
        steps=STEPS,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
        device="auto",
    )
    cluster.wait_step(job, 40, 180)
    lines = _trainer_command_lines(cluster)
    cluster.notes.append(f"trainers: {lines}\nGPU processes: {_gpu_processes()}")
    assert lines and all("--device-index" in line for line in lines), lines

    victim = cluster.job_nodes(job)[0]
    vm = cluster.vm_of(victim)
    cluster.preempt(victim, 10.0)
    cluster.wait(lambda: cluster.node_state(victim) in {"GONE", "LOST", ""}, 120, "the evicted node to leave")
    cluster.wait(lambda: not vm.alive(), 60, "the evicted VM to end (its GPU freed)")
    cluster.add(1)  # the freed GPU goes to the new VM
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    assert final["steps_lost"] == 0, final
    assert final["generation"] >= 2, final
    assert max_rel_diff(train_reference(references, STEPS, BATCH, SEED), checkpoints) <= 1e-9
