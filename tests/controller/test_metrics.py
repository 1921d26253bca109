"""Prometheus metrics from a real controller: scraped over HTTP and parsed as Prometheus would."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.app.daemon import Controller
from controller.app.settings import ControllerSettings
from controller.client import connection as client
from controller.observability.metrics import cause_category, provider_error
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = ControllerSettings(
        state_dir=tmp_path / "state", listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", debounce_seconds=0.0
    )

    async def make() -> Controller:
        made = Controller(settings)
        await made.start()
        return made

    running = asyncio.run_coroutine_threadsafe(make(), loop).result(30)
    try:
        yield running
    finally:
        asyncio.run_coroutine_threadsafe(running.stop(grace=0.5), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_follow_nodes_and_heartbeats(controller: Controller) -> None:
    state = controller.settings.state_dir
    address = f"127.0.0.1:{controller.port}"
    agent_token = (state / "agent.token").read_text().strip()
    registered = rpc.AgentStub(client.channel(address, agent_token)).Register(
        pb.RegisterRequest(slots=2, address="127.0.0.1")
    )
    node = rpc.AgentStub(client.channel(address, registered.node_token))
    for _ in range(3):
        node.Heartbeat(pb.HeartbeatRequest(node_name=registered.node_name, incarnation=registered.incarnation))

    def ready() -> bool:
        return scrape(controller.metrics_port)["spotmorph_nodes"].get((("state", "READY"),), 0) == 1

    deadline = time.monotonic() + 20
    while not ready():
        assert time.monotonic() < deadline, "the node never showed as READY in the metrics"
        node.Heartbeat(pb.HeartbeatRequest(node_name=registered.node_name, incarnation=registered.incarnation))
        time.sleep(0.1)
    samples = scrape(controller.metrics_port)
    assert samples["spotmorph_jobs"][(("state", "QUEUED"),)] == 0
    assert samples["spotmorph_heartbeat_latency_seconds_count"][()] >= 3
    assert samples["spotmorph_heartbeat_latency_seconds_bucket"][(("le", "+Inf"),)] >= 3
    assert samples["spotmorph_morph_seconds_count"][()] == 0
    assert (state / "metrics.addr").read_text().strip().endswith(str(controller.metrics_port))


def test_cause_and_provider_error_labels() -> None:
    assert cause_category("eviction notice: node-2") == "eviction"
    assert cause_category("node lost: node-3") == "node_lost"
    assert cause_category("trainers could not start on node-4; re-planning without it") == "start_failed"
    assert cause_category("2 trainer(s) failed") == "trainer_failed"
    assert cause_category("grow: 161 vs 86 samples/s") == "grow"
    assert cause_category("something new") == "other"
    assert provider_error("AzureThrottled") and not provider_error("AzureScaleOut")
    assert not provider_error("NodeRegistered")
