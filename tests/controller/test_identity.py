"""Issue 21, per-VM identity: a registration proves its VM with a token of that VM's own, and a live
node's name stays with the VM that first registered it (real gRPC server, real agent processes)."""

from __future__ import annotations

import os
import signal
import sys
from functools import partial
from pathlib import Path

import grpc
import pytest

from controller.api.auth import Principal, Role, Tokens
from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.cli import main
from spotmorph.local.processes import reap
from spotmorph.local.provider import LocalProcessProvider, kill_vm
from tests.controller.conftest import Live, running
from tests.controller.test_hostile_edge import Node, refusal, running_job, wait_for
from tests.runtime.helpers import Result, run

DENIED = grpc.StatusCode.PERMISSION_DENIED


def nodes(live: Live) -> dict[str, pb.Node]:
    return {n.name: n for n in live.cluster().ListNodes(pb.ListNodesRequest()).nodes}


def test_another_vm_cannot_take_over_a_live_node_by_claiming_its_instance_id(live: Live) -> None:
    """The attacker's trial: Register(node_name="node-1", instance_id=<another VM>) took the node and its job."""
    victim, job_id, generation = running_job(live)
    assert victim.name == "node-1"
    thief = live.agent(live.agent_token("vm-2"))
    for claimed in ("vm-2", victim.vm, ""):  # its own id, the victim's (which its token does not prove), none
        takeover = pb.RegisterRequest(node_name="node-1", slots=2, address="10.0.0.2", instance_id=claimed)
        code, detail = refusal(partial(thief.Register, takeover))
        assert code == DENIED, detail
    assert "node-1 is alive" in detail and f"belongs to instance {victim.vm}" in detail
    assert victim.beat().assignment.generation == generation  # the victim still runs its job, unmorphed
    job = live.jobs().GetJob(pb.GetJobRequest(id=job_id))
    assert job.generation == generation and nodes(live)["node-1"].incarnation == 1


def test_an_empty_instance_id_from_the_same_address_takes_nothing(live: Live) -> None:
    victim, _, generation = running_job(live)  # registered from 127.0.0.1, no instance id, as cloud-init does
    same_address = pb.RegisterRequest(node_name=victim.name, slots=2, address="127.0.0.1")
    code, detail = refusal(lambda: live.agent(live.agent_token("vm-2")).Register(same_address))
    assert code == DENIED and f"node {victim.name} is alive" in detail and f"belongs to instance {victim.vm}" in detail
    assert victim.beat().assignment.generation == generation


def test_a_token_proves_only_its_own_instance_and_cannot_be_forged(live: Live) -> None:
    claim = pb.RegisterRequest(slots=1, address="h", instance_id="vm-9")
    code, detail = refusal(lambda: live.agent(live.agent_token("vm-1")).Register(claim))
    assert code == DENIED and "instance vm-1's" in detail and "'vm-9'" in detail
    genuine = live.agent_token("vm-1")
    other_secret = Tokens({}, b"another controller's secret").vm_token("vm-1")
    for forged in (genuine.replace("vm-1", "vm-9"), genuine[:-1] + ("0" if genuine[-1] != "0" else "1"), other_secret):
        code, _ = refusal(partial(live.agent(forged).Register, pb.RegisterRequest(slots=1, address="h")))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    assert live.controller.tokens.identify(genuine) == Principal(Role.AGENT, instance="vm-1")
    node_token = live.controller.tokens.node_token("vm", 1)  # a node token's MAC is no VM token's
    assert live.controller.tokens.identify("vm.1." + node_token.rsplit(".", 1)[1]) is None


def test_the_same_vm_registers_its_node_again_as_a_new_incarnation(live: Live) -> None:
    first = Node(live, "gpu-a", address="10.0.0.1", instance="vm-7")
    again = Node(live, "gpu-a", address="10.0.0.1", instance="vm-7")
    assert (again.name, again.incarnation) == ("gpu-a", 2)
    assert nodes(live)["gpu-a"].incarnation == 2 and first.incarnation == 1


def test_one_vm_token_holds_one_live_node(live: Live) -> None:
    """A per-VM token registered node after node, each planned on as capacity (issue 21)."""
    first = Node(live, "gpu-a", address="10.0.0.1", instance="vm-7")
    more = pb.RegisterRequest(node_name="gpu-b", slots=2, address="10.0.0.1")
    code, detail = refusal(lambda: live.agent(live.agent_token("vm-7")).Register(more))
    assert code == DENIED and "instance vm-7 is already node gpu-a" in detail and "register as gpu-a" in detail
    assert sorted(nodes(live)) == ["gpu-a"] and first.beat().assignment is not None
    unnamed = live.agent(live.agent_token("vm-7")).Register(pb.RegisterRequest(slots=2, address="10.0.0.1"))
    assert (unnamed.node_name, unnamed.incarnation) == ("gpu-a", 2)


def test_the_shared_agent_token_is_off_unless_enabled_and_then_binds_only_unverified_claims(tmp_path: Path) -> None:
    with running(tmp_path / "default") as live:
        assert not (live.state_dir / "agent.token").exists()
        assert all(role is not Role.AGENT for role in live.controller.tokens.static.values())
    with running(tmp_path / "shared", shared_agent_token=True) as live:
        shared = live.agent(live.token("agent"))
        proven = Node(live, "n1", address="10.0.0.1", instance="vm-1")
        claim = pb.RegisterRequest(node_name="n1", slots=1, address="10.0.0.1", instance_id="vm-1")
        code, detail = refusal(lambda: shared.Register(claim))  # claiming a proven VM's id proves nothing
        assert code == DENIED and "unverified instance vm-1 may not take it over" in detail
        assert proven.beat().assignment is not None
        manual = pb.RegisterRequest(node_name="manual", slots=1, address="10.0.0.5")
        assert shared.Register(manual).incarnation == 1


def _agent_processes(live: Live, tmp_path: Path) -> LocalProcessProvider:
    return LocalProcessProvider(tmp_path / "cluster", live.address, state_dir=live.state_dir)


@pytest.mark.slow
def test_real_agents_a_restarted_agent_keeps_its_node_and_another_vm_is_turned_away(live: Live, tmp_path: Path) -> None:
    provider = _agent_processes(live, tmp_path)
    try:
        (vm,) = provider.start(1)
        wait_for(lambda: vm.node_name is not None, "the agent to register", 60)
        name = vm.node_name
        assert name is not None and nodes(live)[name].incarnation == 1
        pid = vm.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the agent crashes; the VM (and its token) stay
        reap(pid)
        provider.respawn(vm)
        wait_for(lambda: nodes(live)[name].incarnation == 2, "the restarted agent to get its node back", 60)

        thief = agent(live, tmp_path, live.agent_token("vm-2"), "--name", name)  # another VM wants the name
        assert thief.returncode == 2, thief.stderr
        assert f"node {name} is alive" in thief.stderr and "belongs to instance vm-1" in thief.stderr
        assert "Traceback" not in thief.stderr
        assert nodes(live)[name].incarnation == 2
    finally:
        for started in provider.vms():
            kill_vm(started)


def agent(live: Live, tmp_path: Path, token: str, *args: str) -> Result:
    """A ``spotmorph agent`` process with ``token``, run until it exits (forked from the worker's fork server)."""
    token_file = tmp_path / "thief.token"
    token_file.write_text(token)
    command = [sys.executable, "-m", "spotmorph.cli", "agent", "--controller", live.address, "--slots", "1"]
    command += ["--token-file", str(token_file), "--work-dir", str(tmp_path / "thief"), *args]
    return run(command, timeout=120)


@pytest.mark.parametrize("token", ["vm.vm-1.0", "smt_a-shared-token-nobody-enabled"])
def test_an_agent_without_a_valid_token_exits_2_saying_so(live: Live, tmp_path: Path, token: str) -> None:
    done = agent(live, tmp_path, token)
    assert done.returncode == 2 and "refused to register this agent" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_operator_issues_a_manual_nodes_token_on_the_controllers_machine(
    live: Live, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agent-token", "--state-dir", str(live.state_dir), "--instance-id", "rack-3"]) == 0
    token = capsys.readouterr().out.strip()
    request = pb.RegisterRequest(node_name="rack-3", slots=1, address="10.0.0.3")
    assert live.agent(token).Register(request).incarnation == 1
    assert main(["agent-token", "--state-dir", str(live.state_dir), "--instance-id", "a b"]) == 2
    assert "instance id 'a b'" in capsys.readouterr().err
    assert main(["agent-token", "--state-dir", str(live.state_dir / "nowhere"), "--instance-id", "x"]) == 2
    assert "no node-secret there" in capsys.readouterr().err
