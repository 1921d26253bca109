"""Issue 21, per-VM identity on Azure: the provider hands each running VM its own agent token by a managed
Run Command (real SDK against the fake ARM server, the script run for real), and a real agent on it
registers with that token while another VM's token cannot claim its name."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
from pathlib import Path

import pytest

from controller.tokens import Tokens
from spotmorph.cli import main
from tests.azure.harness import Harness, run, settle
from tests.controller.conftest import running
from tests.token_agents import nodes_of, start_agent, until

SECRET = b"the controller's node secret"


def vm_token(name: str) -> str:
    return Tokens({}, SECRET).vm_token(name)


@pytest.mark.parametrize("mode", ["Uniform", "Flexible"])
def test_each_running_vm_gets_its_own_token_once_through_a_protected_parameter(tmp_path: Path, mode: str) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add_running(3)
        provider = h.provider(vm_token=vm_token, target_capacity=3)
        await provider.list_instances()
        await settle(provider)
        commands = h.fake.run_commands
        assert commands is not None
        for name in names:
            written = commands.etc(name) / "agent.token"
            assert written.read_text() == vm_token(name) + "\n"
            assert stat.S_IMODE(written.stat().st_mode) == 0o640  # the agent's group reads it; nobody else
        assert sorted(e.vm for e in commands.executions) == sorted(names)
        for execution in commands.executions:  # the token only ever travels as a protected parameter
            assert execution.protected == {"SPOTMORPH_AGENT_TOKEN": vm_token(execution.vm)}
            assert vm_token(execution.vm) not in str(execution.parameters)
        assert commands.resources == {}, "the Run Command is deleted once it ran"
        assert h.kinds().count("ProviderAgentTokenDelivered") == 3
        await provider.list_instances()
        await settle(provider)
        assert len(commands.executions) == 3, "a VM is handed its token once"

    run(tmp_path, scenario, orchestration=mode)


def test_a_vm_whose_agent_is_not_ready_is_retried_on_its_own_clock(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        slow, fine = h.fake.add_running(2)
        commands = h.fake.run_commands
        assert commands is not None
        commands.agent_not_ready.add(slow)
        provider = h.provider(vm_token=vm_token, target_capacity=2, token_retry_seconds=60)
        await provider.list_instances()
        await settle(provider)
        assert (commands.etc(fine) / "agent.token").exists() and not (commands.etc(slow) / "agent.token").exists()
        failed = [data for kind, data in h.events if kind == "ProviderAgentTokenFailed"]
        assert len(failed) == 1 and failed[0]["node"] == slow and "has not reported status" in failed[0]["message"]
        assert provider.backoff.not_before <= h.clock.now(), "one VM's trouble does not hold the scale set back"
        assert commands.resources == {}, "a failed Run Command is deleted too (its protected token with it)"
        commands.agent_not_ready.clear()
        await provider.list_instances()
        await settle(provider)
        assert not (commands.etc(slow) / "agent.token").exists(), "not before its retry time"
        h.clock.advance(60)
        await provider.list_instances()
        await settle(provider)
        assert (commands.etc(slow) / "agent.token").read_text() == vm_token(slow) + "\n"

    run(tmp_path, scenario, orchestration="Flexible")


def test_a_vm_not_yet_running_gets_nothing_and_agent_tokens_off_hands_out_none(tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        h.fake.add_running(1)
        off = h.provider(vm_token=vm_token, target_capacity=1, agent_tokens=False)
        await off.list_instances()
        await settle(off)
        commands = h.fake.run_commands
        assert commands is not None and commands.executions == []
        (running,) = h.fake.running()
        on = h.provider(vm_token=vm_token, target_capacity=2)
        await on.list_instances()  # starts a scale-out: the new VM is Creating when listed
        await settle(on)
        assert [e.vm for e in commands.executions] == [running]
        await on.list_instances()  # now it runs
        await settle(on)
        assert len(commands.executions) == 2 and len(h.fake.running()) == 2

    run(tmp_path, scenario, orchestration="Flexible")


@pytest.mark.slow
def test_a_real_agent_waits_for_its_token_registers_with_it_and_another_vms_token_cannot_claim_it(
    tmp_path: Path,
) -> None:
    with running(tmp_path / "controller") as live:

        async def scenario(h: Harness) -> None:
            mine, other = h.fake.add_running(2)
            commands = h.fake.run_commands
            assert commands is not None
            token_file = commands.etc(mine) / "agent.token"
            waiting = start_agent(live.address, tmp_path / "a", token_file, "--wait-for-token", "120",
                                  "--name", mine, "--instance-id", mine)  # fmt: skip
            try:
                await asyncio.sleep(1.0)
                assert waiting.poll() is None and mine not in nodes_of(live), "no token yet: it waits"
                provider = h.provider(vm_token=live.controller.tokens.vm_token, target_capacity=2)
                await provider.list_instances()
                await settle(provider)
                await until(lambda: mine in nodes_of(live), "the agent to register with the token it was handed")
                assert nodes_of(live)[mine].incarnation == 1
                others = commands.etc(other) / "agent.token"  # a genuine token, of another VM
                for claim in (["--instance-id", mine], []):
                    thief = start_agent(live.address, tmp_path / "b", others, "--name", mine, *claim)
                    _, err = thief.communicate(timeout=120)
                    assert thief.returncode == 2 and "Traceback" not in err, err
                    assert ("may not register as instance_id" in err) if claim else (f"node {mine} is alive" in err)
                assert nodes_of(live)[mine].incarnation == 1 and waiting.poll() is None
            finally:
                os.killpg(waiting.pid, signal.SIGKILL)
                waiting.wait(30)

        run(tmp_path / "arm", scenario, orchestration="Flexible")


@pytest.mark.parametrize(
    ("wait", "expected"),
    [("0", "no token there; give this VM its token"), ("nan", "--wait-for-token 'nan': give seconds from 0 to 86400"),
     ("-1", "--wait-for-token '-1'")],
)  # fmt: skip
def test_an_agent_without_its_token_exits_2_naming_the_file_or_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], wait: str, expected: str
) -> None:
    missing = tmp_path / "agent.token"
    args = ["agent", "--controller", "127.0.0.1:1", "--token-file", str(missing), "--wait-for-token", wait]
    assert main([*args, "--work-dir", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_an_agent_whose_token_never_came_exits_75_for_systemd_to_restart_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 is never restarted (RestartPreventExitStatus=2): a controller down past the wait must not leave
    the VM without an agent for good."""
    args = ["agent", "--controller", "127.0.0.1:1", "--token-file", str(tmp_path / "agent.token")]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--wait-for-token", "0.2", "--work-dir", str(tmp_path / "work")])
    assert exited.value.code == 75
    assert "none came within 0.2 s, exiting 75 to be restarted" in capsys.readouterr().err
