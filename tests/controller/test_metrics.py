"""Prometheus metrics from a real controller: scraped over HTTP and parsed as Prometheus would."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.app.daemon import Controller, ControllerSettings
from controller.client import connection as client
from controller.core.causes import MorphCause
from controller.core.model import StartGeneration, World
from controller.observability.metrics import ControllerCollector, provider_error
from controller.persistence.store import Store
from controller.shell.latency import Histogram
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.helpers import job, planner

# the label values of spotmorph_morphs while causes were matched in their words: dashboards use them
LABELS_BEFORE_CAUSES_WERE_STORED = (
    "eviction",
    "node_lost",
    "start_failed",
    "trainer_failed",
    "grow",
    "admitted",
    "resumed",
    "other",
)


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


def test_morphs_are_labelled_by_their_stored_cause_not_their_words(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    submitted = store.add_job(lambda job_id: job(job_id))
    layout = planner().plan([("node-1", 1)]).layout  # type: ignore[union-attr]
    issued = [
        (MorphCause.ADMITTED, "admitted", None),
        (MorphCause.GROW, "grow: no eviction, 2 trainer(s) failed elsewhere", 3.0),
        (MorphCause.EVICTION, "eviction notice: node-1", 4.0),
        (MorphCause.TRAINER_START_FAILED, "words that will be reworded", 5.0),
    ]
    store.persist(
        [
            StartGeneration(submitted.id, generation, layout, 0, cause, words, seconds, 1.0)
            for generation, (cause, words, seconds) in enumerate(issued, 1)
        ]
    )
    world = World({}, {submitted.id: submitted})
    collector = ControllerCollector(SimpleNamespace(world=world), store, Histogram(), now=lambda: 2.0)
    morphs = next(m for m in collector.collect() if m.name == "spotmorph_morphs")
    counted = {s.labels["cause"]: s.value for s in morphs.samples if s.name == "spotmorph_morphs_total"}
    assert counted == {"grow": 1, "eviction": 1, "start_failed": 1}  # generation 1 is no morph
    assert {str(c) for c in MorphCause} == {*LABELS_BEFORE_CAUSES_WERE_STORED}
    store.close()


def test_provider_error_labels() -> None:
    assert provider_error("AzureThrottled") and not provider_error("AzureScaleOut")
    assert not provider_error("NodeRegistered")
