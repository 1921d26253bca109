"""The local cluster shares this host's GPUs out among its VMs: each agent gets ``--gpus`` of its own.

The allocation is pure (property-tested); the provider is driven with real processes standing in for
agents (its ``command``), so what it records and frees is what a real cluster would; ``local up`` on a host
without GPUs refuses ``--gpus-per-node`` with exit 2 before it starts anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from morphing.errors import UserInputError
from spotmorph.local import gpu_share
from spotmorph.local.cli_calls import spotmorph
from spotmorph.local.harness import cluster_env
from spotmorph.local.layout import ClusterDir
from spotmorph.local.processes import wait_for
from spotmorph.local.provider import LocalProcessProvider, kill_vm
from worker_agent.agent import gpu_probe

STAND_IN = (sys.executable, "-c", "import time; time.sleep(600)")  # an "agent" that only lives


@given(
    inventory=st.sets(st.integers(0, 15), max_size=16),
    held=st.sets(st.integers(0, 15), max_size=16),
    count=st.integers(1, 8),
)
def test_a_node_gets_the_lowest_free_gpus_or_a_refusal_naming_what_is_held(
    inventory: set[int], held: set[int], count: int
) -> None:
    free = sorted(inventory - held)
    if len(free) < count:
        with pytest.raises(UserInputError, match=r"no \d+ free GPU"):
            gpu_share.allocate(sorted(inventory), held, count)
        return
    given_out = gpu_share.allocate(sorted(inventory), held, count)
    assert list(given_out) == free[:count]


def test_the_gpus_of_an_agent_are_read_back_from_its_command_line() -> None:
    assert gpu_share.held_by(["spotmorph", "agent", "--gpus", "2,3", "--slots", "2"]) == (2, 3)
    assert gpu_share.held_by(["spotmorph", "agent", "--gpus", "none"]) == ()
    assert gpu_share.held_by(["spotmorph", "agent"]) == ()
    assert gpu_share.flag_value((4, 5)) == "4,5" and gpu_share.flag_value(()) == "none"


def test_a_damaged_gpu_record_names_the_file_and_the_fix(tmp_path: Path) -> None:
    record = tmp_path / "gpus.json"
    gpu_share.record(record, [3, 1])
    assert gpu_share.recorded(record) == (1, 3)
    for damaged in ('{"indices": [-1]}', "[1, 2]", '{"indices": ["0"]}', "not json"):
        record.write_text(damaged)
        with pytest.raises(UserInputError, match="local down"):
            gpu_share.recorded(record)


def test_each_vm_gets_gpus_of_its_own_and_a_dead_vms_gpus_go_to_the_next(tmp_path: Path) -> None:
    files = ClusterDir(tmp_path / "local")
    files.root.mkdir()
    gpu_share.record(files.gpus, [0, 1, 2, 3])
    provider = LocalProcessProvider(files.root, "127.0.0.1:1", slots=2, command=STAND_IN, gpus_per_node=2)
    try:
        first, second = provider.start(2)
        assert [gpu_share.held_by(vm.command()) for vm in (first, second)] == [(0, 1), (2, 3)]
        with pytest.raises(UserInputError, match="hold 0,1,2,3"):
            provider.start(1)
        assert len(provider.vms()) == 2, "a refused start makes no VM"
        kill_vm(first)
        wait_for(lambda: not first.alive(), 30, "the killed VM's agent to be gone")  # SIGKILL is not instant
        (third,) = provider.start(1)
        assert gpu_share.held_by(third.command()) == (0, 1)
        assert third.command()[third.command().index("--slots") + 1] == "2"
    finally:
        for vm in provider.vms():
            kill_vm(vm)


def test_a_cpu_cluster_offers_cpu_slots_as_before(tmp_path: Path) -> None:
    files = ClusterDir(tmp_path / "local")
    provider = LocalProcessProvider(files.root, "127.0.0.1:1", command=STAND_IN)
    try:
        (vm,) = provider.start(1)
        command = vm.command()
        assert command[command.index("--gpus") + 1] == "none"
        assert not files.gpus.exists()
    finally:
        for vm in provider.vms():
            kill_vm(vm)


def test_up_with_gpus_per_node_refuses_before_starting_anything(tmp_path: Path) -> None:
    env = cluster_env(tmp_path)
    too_many_slots = subprocess.run(
        spotmorph("local", "up", "--nodes", "1", "--gpus-per-node", "1", "--slots", "2"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert too_many_slots.returncode == 2, too_many_slots.stderr
    assert "--slots 2 with --gpus-per-node 1" in too_many_slots.stderr and "Traceback" not in too_many_slots.stderr
    found, _ = gpu_probe.discover(sys.executable, env)
    if found:
        pytest.skip(f"this host has {len(found)} GPU(s): the refusal below is for a host without one")
    no_gpu = subprocess.run(
        spotmorph("local", "up", "--nodes", "2", "--gpus-per-node", "1"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert no_gpu.returncode == 2, no_gpu.stderr
    assert "needs 2 GPU(s) of this host, and it has 0" in no_gpu.stderr, no_gpu.stderr
    assert "Traceback" not in no_gpu.stderr
    assert not ClusterDir.of_home(tmp_path).root.exists(), "nothing was started or written"
    assert not (tmp_path / "context.json").exists(), "no client context points at a cluster that is not up"
