"""The local AWS and GCP metadata services (their rules, as the clouds document them, and their admin endpoints),
the platform's evictions on each, and which cloud a local cluster plays."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from morphing.errors import UserInputError
from spotmorph.local.aws_metadata import AwsMetadataServer, AwsMetadataState
from spotmorph.local.clouds import read_cloud, require_warning, vm_metadata_url
from spotmorph.local.gcp_metadata import GcpMetadataServer, GcpMetadataState
from spotmorph.local.layout import ClusterDir
from spotmorph.local.platform import evict_interrupted, shut_down_preempted
from spotmorph.local.processes import alive, wait_for
from spotmorph.local.provider import LocalProcessProvider, kill_vm

NOW = 1_800_000_000.0
STAND_IN = (sys.executable, "-c", "import time; time.sleep(600)")  # an "agent" that only lives, until a signal


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None, body: object = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def aws(clock: Clock) -> Iterator[AwsMetadataServer]:
    server = AwsMetadataServer(state=AwsMetadataState(clock)).start()
    yield server
    server.stop()


@pytest.fixture
def gcp(clock: Clock) -> Iterator[GcpMetadataServer]:
    server = GcpMetadataServer(state=GcpMetadataState(clock)).start()
    yield server
    server.stop()


def test_aws_imdsv2_wants_a_token_of_the_vm_itself_while_it_lives(aws: AwsMetadataServer, clock: Clock) -> None:
    base = f"{aws.base_url}/vm-1"
    ttl = "X-aws-ec2-metadata-token-ttl-seconds"
    assert call(f"{base}/latest/api/token", "PUT")[0] == 400
    assert call(f"{base}/latest/api/token", "PUT", {ttl: "0"})[0] == 400
    assert call(f"{base}/latest/api/token", "PUT", {ttl: "21601"})[0] == 400
    status, token = call(f"{base}/latest/api/token", "PUT", {ttl: "60"})
    assert status == 200 and token
    action = f"{base}/latest/meta-data/spot/instance-action"
    assert call(action)[0] == 401, "IMDSv1 (no token) is refused"
    assert call(action, headers={"X-aws-ec2-metadata-token": token})[0] == 404, "nothing scheduled"
    assert (
        call(f"{aws.base_url}/vm-2/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token})[
            0
        ]
        == 401
    )
    clock.now += 61
    assert call(action, headers={"X-aws-ec2-metadata-token": token})[0] == 401, "expired"


def test_aws_serves_the_interruption_and_the_recommendation_its_admin_schedules(aws: AwsMetadataServer) -> None:
    status, said = call(f"{aws.base_url}/admin/instance-action", "POST", body={"vm": "vm-1", "notice_seconds": 120})
    assert (status, json.loads(said)["time"]) == (201, "2027-01-15T08:02:00Z")
    assert call(f"{aws.base_url}/admin/rebalance", "POST", body={"vm": "vm-1"})[0] == 201
    token = call(f"{aws.base_url}/vm-1/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})[1]
    header = {"X-aws-ec2-metadata-token": token}
    action = call(f"{aws.base_url}/vm-1/latest/meta-data/spot/instance-action", headers=header)
    assert json.loads(action[1]) == {"action": "terminate", "time": "2027-01-15T08:02:00Z"}
    rebalance = call(f"{aws.base_url}/vm-1/latest/meta-data/events/recommendations/rebalance", headers=header)
    assert json.loads(rebalance[1]) == {"noticeTime": "2027-01-15T08:00:00Z"}
    assert call(f"{aws.base_url}/admin/rebalance/vm-1", "DELETE")[0] == 200
    assert call(f"{aws.base_url}/vm-1/latest/meta-data/events/recommendations/rebalance", headers=header)[0] == 404
    for bad in ({"vm": "../etc"}, {"vm": "vm-1", "action": "reboot"}, {"vm": "vm-1", "notice_seconds": "soon"}):
        assert call(f"{aws.base_url}/admin/instance-action", "POST", body=bad)[0] == 400


def test_gcp_answers_with_its_flavor_and_an_etag_that_follows_the_value(gcp: GcpMetadataServer) -> None:
    url = f"{gcp.base_url}/vm-1/computeMetadata/v1/instance/preempted"
    assert call(url)[0] == 403, "no Metadata-Flavor: Google"
    flavor = {"Metadata-Flavor": "Google"}
    request = urllib.request.Request(url, headers=flavor)
    with urllib.request.urlopen(request, timeout=5) as response:
        before = response.headers["ETag"]
        assert response.read() == b"FALSE" and response.headers["Metadata-Flavor"] == "Google"
    assert call(f"{gcp.base_url}/admin/preempt", "POST", body={"vm": "vm-1", "notice_seconds": 30})[0] == 201
    status, value = call(f"{url}?wait_for_change=true&last_etag={before}&timeout_sec=30", headers=flavor)
    assert (status, value) == (200, "TRUE"), "a stale ETag answers at once"
    assert call(f"{url}?wait_for_change=true&timeout_sec=nan", headers=flavor)[0] == 400
    assert call(f"{gcp.base_url}/admin/preempt/vm-1", "DELETE")[0] == 200
    assert call(url, headers=flavor)[1] == "FALSE"
    assert call(f"{gcp.base_url}/admin/preempt", "POST", body={"vm": "vm-1", "notice_seconds": -1})[0] == 400


def test_the_aws_platform_evicts_a_vm_when_its_interruption_is_due(tmp_path: Path, clock: Clock) -> None:
    provider = LocalProcessProvider(tmp_path, "127.0.0.1:1", command=STAND_IN, cloud="aws")
    (vm,) = provider.start(1)
    state = AwsMetadataState(clock)
    try:
        state.schedule(vm.name, "terminate", 120)
        assert evict_interrupted(state, provider) == []
        clock.now += 120
        assert evict_interrupted(state, provider) == [f"interrupted {vm.name} (Spot instance-action)"]
        assert state.due() == []
        wait_for(lambda: not vm.alive(), 10, "the killed stand-in to be gone")
    finally:
        kill_vm(vm)


def test_the_gcp_platform_shuts_the_guest_down_then_stops_the_vm(tmp_path: Path, clock: Clock) -> None:
    provider = LocalProcessProvider(tmp_path, "127.0.0.1:1", command=STAND_IN, cloud="gcp")
    first, second = provider.start(2)
    state = GcpMetadataState(clock)
    try:
        state.preempt(first.name, 30)
        state.preempt(second.name, 30)
        said = shut_down_preempted(state, provider, clock)
        assert said == [f"shutting down {vm.name} (preempted: SIGTERM to its agent)" for vm in (first, second)]
        wait_for(lambda: not first.alive() and not second.alive(), 10, "the stand-ins to end at SIGTERM")
        assert shut_down_preempted(state, provider, clock) == [
            f"preempted {vm.name} (its agent exited)" for vm in (first, second)
        ]
        assert state.preempted() == {}
        (third,) = provider.start(1)
        state.preempt(third.name, 30)
        state.mark_signalled(third.name)  # an agent that takes the SIGTERM as a notice and goes on a while
        assert shut_down_preempted(state, provider, clock) == []
        clock.now += 30
        assert shut_down_preempted(state, provider, clock) == [f"preempted {third.name} (the notice is up)"]
        wait_for(lambda: not alive(third.pid), 10, "the stopped VM to be gone")
    finally:
        for vm in provider.vms():
            kill_vm(vm)


def test_a_cluster_plays_azure_unless_told_and_each_vm_gets_its_own_metadata(tmp_path: Path) -> None:
    files = ClusterDir(tmp_path)
    assert read_cloud(files) == "azure", "a cluster from before --cloud"
    files.cloud.write_text("aws\n")
    assert read_cloud(files) == "aws"
    provider = LocalProcessProvider(tmp_path, "127.0.0.1:1", imds_url="http://127.0.0.1:7", command=STAND_IN)
    (vm,) = provider.start(1)
    try:
        line = vm.command()
        assert line[line.index("--imds-url") + 1] == f"http://127.0.0.1:7/{vm.name}"
        assert line[line.index("--cloud") + 1] == "aws"
    finally:
        kill_vm(vm)
    assert vm_metadata_url("azure", "http://h:1", "vm-1") == "http://h:1", "one document naming the VMs"
    files.cloud.write_text("oracle\n")
    with pytest.raises(UserInputError, match="--cloud 'oracle'"):
        read_cloud(files)


def test_only_aws_has_an_early_warning_and_the_error_says_where_to_find_one() -> None:
    require_warning("aws")
    for cloud in ("gcp", "azure"):
        with pytest.raises(UserInputError, match=f"plays {cloud}.*only aws does.*local up --cloud aws"):
            require_warning(cloud)
