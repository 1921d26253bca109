"""The Identity service on a live controller with the GCP provider (the fake server in a thread of its own): a VM
trades its identity token for its agent token and registers with it; forged tokens get nothing; and the
startup script's `spotmorph gcp agent-token` does the trade against the fake's metadata server."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from spotmorph.cli import main
from tests.controller.conftest import Live, running
from tests.gcp.fake_compute import FakeCompute
from tests.gcp.fake_identity import new_key
from tests.gcp.harness import GROUP, served

AUDIENCE = "spotmorph/spotmorph-test/us-central1-a/spot"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Live, FakeCompute]]:
    """A controller whose provider is the fake's group of two running VMs."""
    with served(running=2) as fake:
        gcp: dict[str, Any] = {
            "project": fake.project,
            "zone": fake.zone,
            "instance_group": GROUP,
            "target_capacity": 2,
            "api_endpoint": fake.base_url,
            "identity_certs": f"{fake.base_url}/oauth2/v3/certs",
        }
        with running(tmp_path, provider="gcp", gcp=gcp) as live:
            yield live, fake


def exchange(live: Live, token: str) -> pb.ExchangeIdentityResponse:
    reply: pb.ExchangeIdentityResponse = rpc.IdentityStub(live.channel(None)).ExchangeIdentity(
        pb.ExchangeIdentityRequest(identity_token=token), timeout=30
    )
    return reply


def test_a_vm_trades_its_identity_for_its_own_token_and_registers_with_it(
    cluster: tuple[Live, FakeCompute],
) -> None:
    live, fake = cluster
    first, second = fake.running(GROUP)
    reply = exchange(live, fake.identity_token(first, AUDIENCE))  # no bearer token: the JWT is the credential
    assert reply.instance_id == first and reply.agent_token == live.controller.tokens.vm_token(first)
    agent = live.agent(reply.agent_token)
    registered = agent.Register(pb.RegisterRequest(node_name=first, slots=1, address="127.0.0.1", instance_id=first))
    assert registered.node_name == first
    with pytest.raises(grpc.RpcError) as refused:  # this VM's token cannot claim another
        agent.Register(pb.RegisterRequest(node_name=second, slots=1, address="127.0.0.1", instance_id=second))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    "forged",
    [
        {"key": "other"},
        {"issued": -7200.0},
        {"audience": "spotmorph/another/cluster"},
    ],
    ids=["forged", "expired", "wrong-audience"],
)
def test_forged_expired_or_misaddressed_tokens_get_nothing(
    cluster: tuple[Live, FakeCompute], forged: dict[str, Any]
) -> None:
    import time

    live, fake = cluster
    name = fake.running(GROUP)[0]
    arguments = {**forged}
    audience = arguments.pop("audience", AUDIENCE)
    if arguments.get("key") == "other":
        arguments["key"] = new_key()
    if "issued" in arguments:
        arguments["issued"] += time.time()
    with pytest.raises(grpc.RpcError) as refused:
        exchange(live, fake.identity_token(name, audience, **arguments))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    for junk in ("", "x" * 20_000):
        with pytest.raises(grpc.RpcError) as bad:
            exchange(live, junk)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_startup_scripts_command_writes_the_token_where_the_agent_reads_it(
    cluster: tuple[Live, FakeCompute], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live, fake = cluster
    name = fake.running(GROUP)[1]
    fake.metadata_instance = name  # the metadata server of this VM
    out = tmp_path / "etc" / "agent.token"
    arguments = ["gcp", "agent-token", "--controller", live.address, "--audience", AUDIENCE, "--out", str(out)]
    assert main([*arguments, "--metadata-url", fake.base_url, "--wait", "0"]) == 0
    assert out.read_text() == live.controller.tokens.vm_token(name) + "\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and capsys.readouterr().out.strip() == name
    with pytest.raises(SystemExit, match=r"no agent token within --wait 0 s: .*UNAUTHENTICATED"):
        main(
            [
                *arguments[:5],
                "spotmorph/another/cluster",
                *arguments[6:],
                "--metadata-url",
                fake.base_url,
                "--wait",
                "0",
            ]
        )


def test_a_controller_without_identity_tokens_says_so_at_once(tmp_path: Path) -> None:
    with served(running=1) as fake, running(tmp_path) as live:  # provider: static
        fake.metadata_instance = fake.running(GROUP)[0]
        with pytest.raises(grpc.RpcError) as refused:
            exchange(live, fake.identity_token(fake.metadata_instance, AUDIENCE))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        out = tmp_path / "agent.token"
        command = ["gcp", "agent-token", "--controller", live.address, "--audience", AUDIENCE, "--out", str(out)]
        assert main([*command, "--metadata-url", fake.base_url, "--wait", "60"]) == 2  # no retrying that
        assert not out.exists()
