"""Training across network namespaces: VMs with addresses of their own, rendezvous over the bridge.

Two VMs train (the planner puts the demo job on two slots); one is preempted with notice, a third VM is
added and the job grows onto it. The job is float64 and its checkpoint is compared with an uninterrupted
single-process run (max relative error <= 1e-9). Needs root; skips with the reason elsewhere.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference, world_size
from spotmorph.local.unplanned import placement

from .netns_helpers import needs_netns, plan_of

pytestmark = [pytest.mark.slow, needs_netns]
BATCH, SEED, INTERVAL = 16, 11, 10


def trainer_bindings(cluster: LocalCluster, job: str, generation: int) -> list[dict[str, str]]:
    """What each trainer of ``generation`` says it bound its collectives by (its log's line; a warm trainer's
    environment is the agent's, set after its exec, so /proc/PID/environ does not show it)."""
    found = []
    for vm in cluster.vms():
        folder = vm.work_dir.trainers.generation_dir(job, generation)
        for rank in folder.pid_files():
            lines = [line for line in folder.log_file(rank).read_text().splitlines() if "collectives bound by" in line]
            found.append(dict(item.split("=", 1) for line in lines[-1:] for item in line.split("bound by ")[1].split()))
    return found


# make soak; make test: training across namespaces through a preemption in test_netns_chaos's short run
@pytest.mark.soak
def test_training_across_namespaces_survives_a_preemption_and_an_added_vm(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=2, slots=1, netns=True)
    plan = plan_of(cluster)
    checkpoints = tmp_path / "ckpt"  # one directory on the shared filesystem, as NFS or Azure Files would be
    job = cluster.submit(
        steps=1_000_000,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
    )
    first = cluster.wait_step(job, 5, 120)
    host = first["rendezvous_endpoint"].rsplit(":", 1)[0]
    assert ipaddress.ip_address(host) in plan.network, "trainers rendezvous at a VM's namespace address"
    environments = trainer_bindings(cluster, job, int(first["generation"]))
    assert environments and all(env.get("GLOO_SOCKET_IFNAME") == "eth0" for env in environments)
    assert all(env.get("NCCL_SOCKET_IFNAME") == "=eth0" for env in environments)

    victim = cluster.job_nodes(job)[-1]
    cluster.cli("local", "preempt", victim, "--notice", "20")

    def shrunk_off_the_victim(status: dict[str, Any]) -> bool:
        # One read: the status's own placement (a node list read apart from it may be newer or older).
        newer = int(status["generation"]) > int(first["generation"])
        return status["state"] == "RUNNING" and newer and victim not in placement(status)

    shrunk = cluster.wait_status(job, shrunk_off_the_victim, 120, "the shrink")
    width = world_size(shrunk)
    cluster.add(1)

    def grown(status: dict[str, Any]) -> bool:
        return status["state"] == "RUNNING" and world_size(status) > width

    after = cluster.wait_status(job, grown, 120, "growth onto the added VM")
    assert after["steps_lost"] == 0
    causes = [m["cause"] for m in after["morphs"]]
    assert any("eviction" in c for c in causes) and any(c.startswith("grow") for c in causes), causes
    cluster.wait_step(job, int(after["step"]) + INTERVAL, 120)
    cluster.cli("cancel", job)
    cluster.wait_state(job, {"CANCELLED"}, 60)
    cluster.wait_released(job)  # the trainers stop at the agents' next heartbeat: then the checkpoint is final
    verified = cluster.cli_json("checkpoint", "verify", str(checkpoints))
    assert int(verified["step"]) > int(after["step"]), "no checkpoint was written after the growth"
    expected = train_reference(references, int(verified["step"]), BATCH, SEED)
    assert max_rel_diff(expected, checkpoints) <= 1e-9, f"at step {verified['step']}"
