"""Per-instance identity on AWS: the provider hands each instance in service its own agent token by two SSM Run
Commands (real boto3 against moto, the scripts run for real by the fake's SSM agent), the token sealed to a key
the instance made, so that neither SSM's command history nor the instance's script files ever hold it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from controller.providers.aws_tokens import OPEN_SCRIPT, HandOverFailed, public_key, seal
from controller.tokens import Tokens
from tests.aws.fake_aws import MotoServer
from tests.aws.harness import Harness, run, settle
from tests.controller.conftest import running
from tests.token_agents import nodes_of, start_agent, until

pytestmark = pytest.mark.xdist_group("moto")  # the worker whose moto is warm (make test: --dist loadgroup)
SECRET = b"the controller's node secret"


def vm_token(instance: str) -> str:
    return Tokens({}, SECRET).vm_token(instance)


@pytest.mark.slow  # an RSA key made by openssl for each instance: seconds on a busy machine
def test_each_instance_gets_its_own_token_once_and_no_aws_record_holds_it(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    async def scenario(h: Harness) -> None:
        names = h.fake.add(2)
        provider = h.provider(vm_token=vm_token, min_capacity=2)
        await provider.list_instances()
        await settle(provider)
        for name in names:
            written = h.fake.etc(name) / "agent.token"
            assert written.read_text() == vm_token(name) + "\n"
            assert stat.S_IMODE(written.stat().st_mode) == 0o640  # the agent's group reads it; nobody else
            assert not (h.fake.etc(name) / "agent-token.key").exists(), "the key goes once the token is there"
        assert h.kinds().count("ProviderAgentTokenDelivered") == 2
        history = json.dumps(moto_server.client("ssm").list_commands()["Commands"], default=str)
        assert len(json.loads(history)) == 4  # two commands an instance, both in SSM's history ...
        scripts = [i.script + i.stdout + i.stderr for i in h.fake.invocations.values()]
        for name in names:  # ... and on the instance, without the token in any of them
            assert vm_token(name) not in history and all(vm_token(name) not in s for s in scripts)
            assert name.encode() not in b"".join(s.encode() for s in scripts if "pkeyutl" in s)
        await provider.list_instances()
        await settle(provider)
        assert len(h.fake.invocations) == 4, "an instance is handed its token once"

    run(moto_server, tmp_path, scenario)


@pytest.mark.slow  # an RSA key made by openssl
def test_an_instance_whose_ssm_agent_is_not_online_is_retried_on_its_own_clock(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    async def scenario(h: Harness) -> None:
        (slow,) = h.fake.add(1)
        h.fake.ssm_offline.add(slow)
        h.fake.invocation_polls = 2  # each command is InProgress twice before it ends
        provider = h.provider(vm_token=vm_token, min_capacity=1, token_retry_seconds=60)
        await provider.list_instances()
        await settle(provider)
        assert not h.fake.etc(slow).exists()
        failed = [data for kind, data in h.events if kind == "ProviderAgentTokenFailed"]
        assert len(failed) == 1 and failed[0]["node"] == slow and "InvalidInstanceId" in failed[0]["message"]
        assert failed[0]["retry_at"] == h.clock.now() + 60
        assert provider.backoff.not_before <= h.clock.now(), "one instance's trouble does not hold the group back"
        h.fake.ssm_offline.clear()
        await provider.list_instances()
        await settle(provider)
        assert not h.fake.etc(slow).exists(), "not before its retry time"
        h.clock.advance(60)
        await provider.list_instances()
        await settle(provider)
        assert (h.fake.etc(slow) / "agent.token").read_text() == vm_token(slow) + "\n"

    run(moto_server, tmp_path, scenario)


def test_a_failing_script_fails_that_hand_over_alone(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        (name,) = h.fake.add(1)
        h.fake.etc(name).mkdir(parents=True)
        (h.fake.etc(name) / "agent-token.key").write_text("not a key\n")  # openssl refuses it: exit 1
        provider = h.provider(vm_token=vm_token, min_capacity=1)
        await provider.list_instances()
        await settle(provider)
        failed = [data["message"] for kind, data in h.events if kind == "ProviderAgentTokenFailed"]
        assert len(failed) == 1 and "spotmorph agent token: key: Failed" in failed[0]
        assert not (h.fake.etc(name) / "agent.token").exists()

    run(moto_server, tmp_path, scenario)


def test_the_instances_output_is_read_as_hostile() -> None:
    with pytest.raises(HandOverFailed, match="printed no public key"):
        public_key("<script>alert(1)</script>" * 2000)
    with pytest.raises(HandOverFailed, match="printed no public key"):
        public_key("")
    small = (
        "-----BEGIN PUBLIC KEY-----\nMFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBAMZ7wG0rLRo1tSxMiQK8vWEsz7YU3hP1\n"
        "gE3ZP6gp9qL6z3dPU0zPbUkPwQ+3zyTHdVL7dE1CE6qXkdpqpj7tGV0CAwEAAQ==\n-----END PUBLIC KEY-----\n"
    )
    with pytest.raises(HandOverFailed):  # 512 bits: too short to be found, or refused when sealing
        seal("vm.i-0.token", public_key(small * 3))


def test_what_the_controller_seals_the_instances_openssl_opens(tmp_path: Path) -> None:
    """The two halves of the hand-over agree (RSA-OAEP with SHA-256 on both sides), with a key made here."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "agent-token.key").write_bytes(pem)
    printed = (
        "noise\n"
        + key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    script = OPEN_SCRIPT.replace("@SEALED@", seal(vm_token("i-0123456789abcdef0"), public_key(printed)))
    env = {"PATH": os.environ["PATH"], "SPOTMORPH_ETC": str(tmp_path)}
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "agent.token").read_text() == vm_token("i-0123456789abcdef0") + "\n"
    assert not (tmp_path / "agent-token.key").exists() and not (tmp_path / "agent.token.new").exists()


@pytest.mark.slow
def test_a_real_agent_waits_for_its_sealed_token_registers_and_another_instances_token_cannot_claim_it(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    with running(tmp_path / "controller") as live:

        async def scenario(h: Harness) -> None:
            mine, other = h.fake.add(2)
            waiting = start_agent(live.address, tmp_path / "a", h.fake.etc(mine) / "agent.token", "--wait-for-token",
                                  "120", "--name", mine, "--instance-id", mine)  # fmt: skip
            try:
                provider = h.provider(vm_token=live.controller.tokens.vm_token, min_capacity=2)
                await provider.list_instances()
                await settle(provider)
                await until(lambda: mine in nodes_of(live), "the agent to register with the token it was handed")
                stolen = h.fake.etc(other) / "agent.token"  # a genuine token, of another instance
                for claim in (["--instance-id", mine], []):
                    thief = start_agent(live.address, tmp_path / "b", stolen, "--name", mine, *claim)
                    _, err = thief.communicate(timeout=120)
                    assert thief.returncode == 2 and "Traceback" not in err, err
                    assert ("may not register as instance_id" in err) if claim else (f"node {mine} is alive" in err)
                assert nodes_of(live)[mine].incarnation == 1 and waiting.poll() is None
            finally:
                os.killpg(waiting.pid, signal.SIGKILL)
                waiting.wait(30)

        run(moto_server, tmp_path / "aws", scenario)


def test_at_most_eight_hand_overs_are_under_way_at_once(moto_server: MotoServer, tmp_path: Path) -> None:
    """Each hand-over polls SSM, whose rate is limited: a group of ten new instances gets its tokens in turns."""

    async def scenario(h: Harness) -> None:
        h.fake.add(10)
        provider = h.provider(vm_token=vm_token, min_capacity=10)
        release = asyncio.Event()
        started: list[str] = []

        async def held(instance_id: str, token: str) -> None:  # delivered once released
            started.append(instance_id)
            await release.wait()

        provider._hand_token = held  # type: ignore[method-assign]
        await provider.list_instances()
        await asyncio.sleep(0)
        assert len(started) == 8
        await provider.list_instances()
        assert len(started) == 8, "none more while eight are under way"
        release.set()
        await settle(provider)
        await provider.list_instances()
        await settle(provider)
        assert len(set(started)) == 10

    run(moto_server, tmp_path, scenario, max_size=10)
