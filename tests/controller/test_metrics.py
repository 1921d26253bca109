"""Prometheus metrics: scraped over HTTP from a real controller, and rendered from a snapshot made by
hand; both parsed as Prometheus would."""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from controller.app.settings import ControllerSettings
from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import JobState, NodeState
from controller.core.records import CheckpointRef
from controller.observability.metrics import host_allowed, host_names, provider_error, render
from controller.persistence.store import GenerationRow
from controller.shell.latency import BOUNDS
from controller.shell.views import LatencySnapshot, MetricsSnapshot
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live, running
from tests.controller.helpers import job, node


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_follow_nodes_and_heartbeats(live: Live) -> None:
    agent = live.agent(live.agent_token())
    registered = agent.Register(pb.RegisterRequest(slots=2, address="127.0.0.1"))
    node_agent = live.agent(registered.node_token)
    beat = pb.HeartbeatRequest(node_name=registered.node_name, incarnation=registered.incarnation)
    for _ in range(3):
        node_agent.Heartbeat(beat)

    def ready() -> bool:
        return parse(live.scrape())["spotmorph_nodes"].get((("state", "READY"),), 0) == 1

    deadline = time.monotonic() + 20
    while not ready():
        assert time.monotonic() < deadline, "the node never showed as READY in the metrics"
        node_agent.Heartbeat(beat)
        time.sleep(0.1)
    samples = parse(live.scrape())
    assert samples["spotmorph_jobs"][(("state", "QUEUED"),)] == 0
    assert samples["spotmorph_heartbeat_latency_seconds_count"][()] >= 3
    assert samples["spotmorph_heartbeat_latency_seconds_bucket"][(("le", "+Inf"),)] >= 3
    assert samples["spotmorph_morph_seconds_count"][()] == 0
    assert (live.state_dir / "metrics.addr").read_text().strip().endswith(str(live.controller.metrics_port))


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


def generation(job_id: str, number: int, cause: MorphCause, words: str, seconds: float | None) -> GenerationRow:
    return GenerationRow(job_id, number, {}, 0, words, seconds, issued_at=0.0, morph_cause=cause)


def test_a_snapshot_renders_to_what_it_holds() -> None:
    """Rendering is a pure function of the snapshot: rates use the snapshot's time, not the wall clock."""
    running = job(
        "job-1", JobState.RUNNING, at=100.0, step=30, resume=CheckpointRef(10, 1)
    )  # 20 steps x 8 samples in 40 s
    latency = [0] * len(BOUNDS)
    latency[0] = 2
    snapshot = MetricsSnapshot(
        now=140.0,
        nodes=(node("a"), node("b", NodeState.LOST), node("c", NodeState.LOST)),
        jobs=(
            running,
            job("job-2"),
            job("job-3", JobState.FAILED, failure_cause=JobFailureCause.USER_ERROR),
            job("job-4", JobState.FAILED, failure_cause=JobFailureCause.USER_ERROR),
            job("job-5", JobState.FAILED, failure_cause=JobFailureCause.TRAINERS_FAILED),
        ),
        generations=(
            generation("job-1", 1, MorphCause.ADMITTED, "admitted", None),  # the first generation is no morph
            generation("job-1", 2, MorphCause.EVICTION, "eviction notice: a", 12.0),
            # the label comes from the stored cause, never from the words (which may be reworded)
            generation("job-1", 3, MorphCause.NODE_LOST, "grow: words that say something else", 700.0),
        ),
        event_counts=MappingProxyType({"ProviderThrottled": 4, "ProviderScaleOut": 9, "NodeRegistered": 3}),
        heartbeat_latency=LatencySnapshot(tuple(latency), 2, 2e-5),
    )
    samples = parse(render(snapshot).decode())
    assert samples["spotmorph_nodes"][(("state", "LOST"),)] == 2
    assert samples["spotmorph_nodes"][(("state", "GONE"),)] == 0
    assert samples["spotmorph_jobs"][(("state", "QUEUED"),)] == 1
    failed = samples["spotmorph_jobs_failed"]
    assert failed[(("cause", "user_error"),)] == 2 and failed[(("cause", "trainers_failed"),)] == 1
    assert failed[(("cause", "unplannable"),)] == 0 and len(failed) == len(JobFailureCause)
    assert samples["spotmorph_job_samples_per_second"] == {(("job", "job-1"),): 4.0}
    assert samples["spotmorph_morphs_total"] == {(("cause", "eviction"),): 1, (("cause", "node_lost"),): 1}
    assert samples["spotmorph_morph_seconds_bucket"][(("le", "20.0"),)] == 1
    assert samples["spotmorph_morph_seconds_bucket"][(("le", "+Inf"),)] == 2
    assert samples["spotmorph_provider_errors_total"] == {(("kind", "ProviderThrottled"),): 4}
    assert samples["spotmorph_heartbeat_latency_seconds_bucket"][(("le", "0.001"),)] == 2


def test_morph_labels_are_the_ones_dashboards_use_and_provider_errors_are_recognised() -> None:
    # every label dashboards knew is still there; the ones added since are new label values, not renamings
    added = {"collective_failed", "peer_unreachable", "eviction_risk", "growth_undone", "on_demand_returned", "shrunk"}
    assert {str(c) for c in MorphCause} == {*LABELS_BEFORE_CAUSES_WERE_STORED, *added}
    assert provider_error("ProviderThrottled") and not provider_error("ProviderScaleOut")
    assert provider_error("AzureThrottled") and not provider_error("AzureScaleOut"), "kinds an older database holds"
    assert not provider_error("NodeRegistered")


def get(port: int, host: str, path: str = "/metrics") -> tuple[int, str]:
    """A GET with this Host header, as a browser page of another origin would send it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.putrequest("GET", path, skip_host=True)
    connection.putheader("Host", host)
    connection.endheaders()
    response = connection.getresponse()
    return response.status, response.read().decode()


def test_the_metrics_port_answers_only_its_own_names(tmp_path: Path) -> None:
    """Issue 44: /metrics answered any Host header, so a page on attacker.example (rebound to 127.0.0.1) could
    read it. Its own names, IP addresses and the operator's names are answered; other names get 421."""
    with running(tmp_path, metrics_allowed_hosts=["prometheus-target.internal"]) as live:
        port = live.controller.metrics_port
        for host in ("127.0.0.1", f"127.0.0.1:{port}", f"[::1]:{port}", f"localhost:{port}", socket.gethostname()):
            assert get(port, host)[0] == 200, host
        assert get(port, "Prometheus-Target.internal:9100")[0] == 200
        for host in ("attacker.example", f"attacker.example:{port}", "localhost.attacker.example", "[::1"):
            status, body = get(port, host)
            assert status == 421 and "is not this server's name" in body, (host, status, body)
        assert get(port, "attacker.example", "/")[0] == 421  # the dashboard's routes too


def test_allowed_host_names_are_checked() -> None:
    with pytest.raises(ValidationError, match="metrics_allowed_hosts"):
        ControllerSettings(state_dir=Path("/tmp/x"), metrics_allowed_hosts=["bad name/with slash"])
    assert not host_allowed("evil.example", host_names("0.0.0.0"))
    assert host_allowed("[2001:db8::1]:80", frozenset())
