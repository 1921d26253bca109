"""Mutual TLS end to end: certificates made by ``spotmorph certs``, a real server with ``tls_ca``.

A client presenting a certificate signed by the cluster CA gets through (and still needs its token);
one without a client certificate, or with one from another CA, is refused in the handshake.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from controller.app.daemon import Controller
from controller.app.settings import ControllerSettings
from controller.client import connection as client
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.runtime.helpers import run


def certs(folder: Path, *extra: str) -> Path:
    command = [sys.executable, "-m", "spotmorph.cli", "certs", str(folder), "--host", "127.0.0.1", *extra]
    done = run(command, timeout=60)
    assert done.returncode == 0, done.stderr
    return folder


@dataclass
class TlsServer:
    controller: Controller
    address: str
    certs: Path
    token: str


@pytest.fixture
def server(tmp_path: Path) -> Iterator[TlsServer]:
    folder = certs(tmp_path / "certs", "--client", "operator", "--client", "agent-a", "--client", "agent-b")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = ControllerSettings(
        state_dir=tmp_path / "state",
        listen="127.0.0.1:0",
        tls_cert=folder / "server.crt",
        tls_key=folder / "server.key",
        tls_ca=folder / "ca.crt",
    )

    async def make() -> Controller:
        controller = Controller(settings)
        await controller.start()
        return controller

    controller = asyncio.run_coroutine_threadsafe(make(), loop).result(30)
    token = (settings.state_dir / "operator.token").read_text().strip()
    try:
        yield TlsServer(controller, f"127.0.0.1:{controller.port}", folder, token)
    finally:
        asyncio.run_coroutine_threadsafe(controller.stop(grace=0.5), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def list_jobs(channel: grpc.Channel) -> pb.ListJobsResponse:
    return rpc.JobsStub(channel).ListJobs(pb.ListJobsRequest(), timeout=10)


def refused(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        list_jobs(channel)
    return info.value.code()


def test_client_certificate_from_the_cluster_ca_gets_through(server: TlsServer) -> None:
    c = server.certs
    channel = client.channel(server.address, server.token, c / "ca.crt", c / "operator.crt", c / "operator.key")
    assert list(list_jobs(channel).jobs) == []
    untokened = client.channel(server.address, None, c / "ca.crt", c / "operator.crt", c / "operator.key")
    assert refused(untokened) == grpc.StatusCode.UNAUTHENTICATED  # TLS does not replace the token


def test_client_without_a_certificate_is_refused(server: TlsServer) -> None:
    assert refused(client.channel(server.address, server.token, server.certs / "ca.crt")) == grpc.StatusCode.UNAVAILABLE


def test_client_certificate_from_another_ca_is_refused(server: TlsServer, tmp_path: Path) -> None:
    other = certs(tmp_path / "other", "--client", "intruder")
    channel = client.channel(
        server.address, server.token, server.certs / "ca.crt", other / "intruder.crt", other / "intruder.key"
    )
    assert refused(channel) == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_is_refused(server: TlsServer) -> None:
    assert refused(client.channel(server.address, server.token)) == grpc.StatusCode.UNAVAILABLE


def test_apscheduler_per_tick_logging_is_silenced(server: TlsServer) -> None:
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.WARNING


def test_a_live_node_name_is_bound_to_its_client_certificate(server: TlsServer) -> None:
    """Under mutual TLS the certificate is part of an agent's identity: another one cannot take the name."""
    c, agent_token = server.certs, server.controller.tokens.vm_token("vm-1")

    def agent(name: str) -> rpc.AgentStub:
        channel = client.channel(server.address, agent_token, c / "ca.crt", c / f"{name}.crt", c / f"{name}.key")
        return rpc.AgentStub(channel)

    request = pb.RegisterRequest(node_name="n1", slots=1, address="10.0.0.1", instance_id="vm-1")
    assert agent("agent-a").Register(request, timeout=10).incarnation == 1
    with pytest.raises(grpc.RpcError) as info:
        agent("agent-b").Register(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert agent("agent-a").Register(request, timeout=10).incarnation == 2
