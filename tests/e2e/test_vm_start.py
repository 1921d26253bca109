"""A local cluster's VMs forked from one process that imported once (spotmorph.local.vm_start): each agent is a
new interpreter in its VM's session and namespace, its zygote a fork it adopted, and the job trains as on VMs
started from scratch; an agent that keeps no warm trainers ends the zygote it was handed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from spotmorph.local.processes import alive, read_pid

from .netns_helpers import REASON

pytestmark = pytest.mark.slow
BATCH, SEED, STEPS = 16, 3, 12


def stat_of(pid: int) -> list[str]:
    """/proc/PID/stat after the command's name: state, parent, process group, session, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()


def net_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@pytest.mark.parametrize(
    "netns",  # the loopback VM in make soak: the namespaced one forks the same way and enters its namespace first
    [
        pytest.param(False, marks=pytest.mark.soak),
        pytest.param(True, marks=pytest.mark.skipif(REASON is not None, reason=f"{REASON}")),
    ],
)
def test_a_forked_vms_agent_adopts_its_zygote_and_its_job_trains(
    cluster: LocalCluster, tmp_path: Path, references: Path, netns: bool
) -> None:
    cluster.up(nodes=1, slots=1, netns=netns)
    (vm,) = cluster.vms()
    agent = vm.pid
    assert agent is not None and alive(agent)
    assert Path(f"/proc/{agent}/cmdline").read_bytes().split(b"\0")[1:5] == [
        b"-m",
        b"spotmorph.cli",
        b"agent",
        b"--controller",
    ]
    assert stat_of(agent)[3] == str(agent), "the agent leads the VM's session"
    pid_file = vm.work_dir.trainers.warm_spool(f"z-{agent}").pid_file
    cluster.wait(lambda: read_pid(pid_file) is not None, 30, "the agent to adopt its zygote (its pid file)")
    zygote = read_pid(pid_file)
    assert zygote is not None and alive(zygote)
    assert stat_of(zygote)[1] == str(agent), "the zygote is the agent's child"
    assert stat_of(zygote)[2] == str(zygote) and stat_of(zygote)[3] == str(agent), "its own group, the VM's session"
    assert b"worker_agent.runtime.process.zygote" not in Path(f"/proc/{zygote}/cmdline").read_bytes(), (
        "forked, not started"
    )
    assert net_namespace(zygote) == net_namespace(agent)
    assert (net_namespace(agent) != net_namespace(os.getpid())) == netns

    checkpoints = tmp_path / "ckpt"
    job = cluster.submit(steps=STEPS, global_batch=BATCH, seed=SEED, dtype="float64", checkpoint_dir=checkpoints)
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 120)
    assert final["state"] == "SUCCEEDED", final
    assert max_rel_diff(train_reference(references, STEPS, BATCH, SEED), checkpoints) <= 1e-9
    trainer_log = vm.work_dir.trainers.generation_dir(job, 1).log_file(0).read_text()
    assert "collectives bound by GLOO_SOCKET_IFNAME=" in trainer_log, "the agent's environment, told to the zygote"


def test_an_agent_that_keeps_no_warm_trainers_ends_the_zygote_it_was_handed(cluster: LocalCluster) -> None:
    cluster.up(nodes=1, slots=1, warm_trainers=0)
    (vm,) = cluster.vms()
    agent = vm.pid
    assert agent is not None and alive(agent)
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == agent]
    assert children == [], f"the agent {agent} keeps no zygote and no warm trainer: {children}"
    assert not vm.work_dir.trainers.warm_spool(f"z-{agent}").pid_file.exists()


def _parent(pid: int) -> int:
    try:
        return int(stat_of(pid)[1])
    except (OSError, IndexError, ValueError):
        return 0
