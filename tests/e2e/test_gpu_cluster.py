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

from spotmorph.local.harness import LocalCluster

from .test_elastic import assert_equals_reference, submit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu on a GPU machine)"),
]


def _trainer_starts(cluster: LocalCluster) -> dict[str, list[str]]:
    """Each VM's agent-log lines that started a trainer ("starting TrainerKey(...) in slot 0 on cuda:0"): a
    trainer runs in a warm spare process, so its command line does not name its device; the agent does."""
    return {
        vm.name: [line for line in vm.log.read_text().splitlines() if " starting TrainerKey(" in line]
        for vm in cluster.vms()
    }


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
    job = submit(cluster, checkpoints)  # the demo spec's device: auto, so CUDA on a node with a GPU
    cluster.wait_step(job, 40, 180)
    cluster.notes.append(f"GPU processes while generation 1 trained: {_gpu_processes()}")
    first = _trainer_starts(cluster)
    assert [line.endswith(" on cuda:0") for lines in first.values() for line in lines] == [True], first

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
    assert_equals_reference(checkpoints, references)
    after = {name: lines for name, lines in _trainer_starts(cluster).items() if name not in first}
    assert after and all(line.endswith(" on cuda:0") for lines in after.values() for line in lines), after
    assert any(after.values()), after
