"""AWS on loopback: moto's server (one a test worker) behind a front of our own that the tests perturb.

:class:`MotoServer` is ``moto.server.ThreadedMotoServer`` on a free port: real HTTP, the real Query (Auto
Scaling, EC2) and JSON (SSM) protocols, and state (a launch template, a group with a mixed instances policy,
instances it launches and replaces). :class:`FakeAws` is one test's view: its group, made in moto, and a front
(HTTP/1.0 on 127.0.0.1, each request a connection of its own) that the provider is pointed at, which forwards
to moto except where a knob says otherwise:

- ``throttle(n)``: the next n requests answer AWS's throttling error (400 ``Throttling``, or
  ``ThrottlingException`` in SSM's JSON);
- ``unreachable(True)``: the front stops listening (connection refused) until ``unreachable(False)``;
- ``stall(True)``: requests that change the group wait until ``stall(False)``;
- ``failed_launch(message)``: DescribeScalingActivities answers one more failed launch with that message;
- ``hostile[action] = (status, body)``: that answer instead of moto's;
- SSM: a Run Command (SendCommand) is executed for real by ``sh`` for each instance, as the SSM agent runs it
  (root there; here ``SPOTMORPH_ETC`` points at the instance's folder under ``etc_root``), and
  GetCommandInvocation answers InProgress until it ended, then what it did (``invocation_polls``: how many
  times InProgress at least);
  ``ssm_offline`` holds instances whose SSM agent is not online (SendCommand: InvalidInstanceId).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import re
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import pytest
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
AMI = "ami-0123456789abcdef0"
MUTATIONS = frozenset({"SetDesiredCapacity", "TerminateInstanceInAutoScalingGroup", "SendCommand"})
SCOPE = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/([a-z0-9-]+)/aws4_request")


class MotoServer:
    """moto in server mode on a free loopback port, for the whole test session (a worker's)."""

    def __init__(self) -> None:
        self.server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"

    def client(self, service: str) -> Any:
        """A client straight to moto (no front): what a test sets up and inspects with."""
        return boto3.client(service, endpoint_url=self.url, region_name=REGION, **CREDENTIALS)

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=30).read()

    def stop(self) -> None:
        self.server.stop()


@dataclass
class Invocation:
    instance: str
    script: str
    polls_left: int
    status: str = "InProgress"
    stdout: str = ""
    stderr: str = ""
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class FakeAws:
    moto: MotoServer
    etc_root: Path
    group: str = "spotmorph-spot"
    on_demand_group: str | None = None  # a second group, of On-Demand instances only (deploy/aws's OnDemandGroup)
    max_size: int = 8
    min_size: int = 0
    invocation_polls: int = 0
    ssm_offline: set[str] = field(default_factory=set)
    hostile: dict[str, tuple[int, str]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (service, action), as they came
    invocations: dict[tuple[str, str], Invocation] = field(default_factory=dict)  # (command, instance)
    _throttle: int = 0
    _launches: list[str] = field(default_factory=list)
    _stalled: threading.Event = field(default_factory=threading.Event)  # set: not stalled
    _server: ThreadingHTTPServer | None = None
    _port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._stalled.set()

    # -- setup

    def start(self) -> str:
        """The group in moto (as deploy/aws's template makes it) and the front; the front's URL."""
        ec2 = self.moto.client("ec2")
        template = f"{self.group}-launch"
        ec2.create_launch_template(
            LaunchTemplateName=template, LaunchTemplateData={"ImageId": AMI, "InstanceType": "g5.xlarge"}
        )
        self._create_group(self.group, template, spot=True)
        if self.on_demand_group is not None:
            self._create_group(self.on_demand_group, template, spot=False)
        self._listen()
        return self.url

    def _create_group(self, name: str, template: str, spot: bool) -> None:
        """Spot: a mixed instances policy of several types, price-capacity-optimized, capacity rebalance on;
        On-Demand: the launch template's type, nothing to rebalance."""
        arguments: dict[str, Any] = {
            "AutoScalingGroupName": name,
            "MinSize": self.min_size if spot else 0,
            "MaxSize": self.max_size,
            "DesiredCapacity": self.min_size if spot else 0,
            "AvailabilityZones": [f"{REGION}a", f"{REGION}b"],
            "NewInstancesProtectedFromScaleIn": True,
        }
        if not spot:
            arguments["LaunchTemplate"] = {"LaunchTemplateName": template, "Version": "$Latest"}
            self.moto.client("autoscaling").create_auto_scaling_group(**arguments)
            return
        self.moto.client("autoscaling").create_auto_scaling_group(
            **arguments,
            CapacityRebalance=True,
            MixedInstancesPolicy={
                "LaunchTemplate": {
                    "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
                    "Overrides": [{"InstanceType": t} for t in ("g5.xlarge", "g6.xlarge", "g4dn.xlarge")],
                },
                "InstancesDistribution": {
                    "OnDemandBaseCapacity": 0,
                    "OnDemandPercentageAboveBaseCapacity": 0,
                    "SpotAllocationStrategy": "price-capacity-optimized",
                },
            },
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def stop(self) -> None:
        self._stalled.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _listen(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a connection a request: a stopped front refuses the next one

            def do_POST(self) -> None:
                fake._handle(self)

            do_GET = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                return None

        server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        server.daemon_threads = True
        self._port = server.server_address[1]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self._server = server

    # -- knobs and views

    def throttle(self, requests: int) -> None:
        self._throttle = requests

    def unreachable(self, on: bool) -> None:
        if on and self._server is not None:
            self.stop()
        elif not on and self._server is None:
            self._listen()

    def stall(self, on: bool) -> None:
        (self._stalled.clear if on else self._stalled.set)()

    def failed_launch(self, message: str) -> None:
        self._launches.append(message)

    def describe(self, group: str | None = None) -> dict[str, Any]:
        scaling = self.moto.client("autoscaling")
        groups = scaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group or self.group])
        found: dict[str, Any] = groups["AutoScalingGroups"][0]
        return found

    def names(self, group: str | None = None) -> frozenset[str]:
        """The instances in service of the Spot group (or of ``group``)."""
        instances = self.describe(group)["Instances"]
        return frozenset(i["InstanceId"] for i in instances if i["LifecycleState"] == "InService")

    def add(self, count: int) -> list[str]:
        """``count`` more instances in service (as if the group had them before the provider started)."""
        before = self.names()
        self.moto.client("autoscaling").set_desired_capacity(
            AutoScalingGroupName=self.group, DesiredCapacity=self.describe()["DesiredCapacity"] + count
        )
        return sorted(self.names() - before)

    def evict(self, instance: str) -> None:
        """A Spot interruption: EC2 terminates the instance; the group replaces it."""
        self.moto.client("ec2").terminate_instances(InstanceIds=[instance])

    def mutations(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[1] in MUTATIONS]

    def etc(self, instance: str) -> Path:
        return self.etc_root / instance

    # -- the front

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        scope = SCOPE.search(handler.headers.get("Authorization", ""))
        service = scope.group(1) if scope else "?"
        target = handler.headers.get("X-Amz-Target", "")
        action = target.rsplit(".", 1)[-1] if target else urllib.parse.parse_qs(body.decode()).get("Action", ["?"])[0]
        with self._lock:
            self.requests.append((service, action))
            throttled = self._throttle > 0
            self._throttle -= 1 if throttled else 0
        if throttled:
            return self._error(handler, service, "ThrottlingException" if target else "Throttling", "Rate exceeded")
        if action in MUTATIONS:
            self._stalled.wait(60)
        if action in self.hostile:
            status, text = self.hostile[action]
            return _reply(handler, status, text.encode(), "text/xml")
        if action == "SendCommand":
            return self._send_command(handler, body)
        if action == "GetCommandInvocation":
            return self._invocation(handler, body)
        if action == "DescribeScalingActivities" and self._launches:
            return _reply(handler, 200, self._activities().encode(), "text/xml")
        self._forward(handler, body)

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        connection = http.client.HTTPConnection(self.moto.url.removeprefix("http://"), timeout=60)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "connection")}
        connection.request(handler.command, handler.path, body, headers)
        answer = connection.getresponse()
        data = answer.read()
        _reply(handler, answer.status, data, answer.getheader("Content-Type") or "text/xml")
        connection.close()

    def _error(self, handler: BaseHTTPRequestHandler, service: str, code: str, message: str) -> None:
        if service == "ssm":
            document = json.dumps({"__type": code, "message": message}).encode()
            return _reply(handler, 400, document, "application/x-amz-json-1.1")
        xml = (
            f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
            "<RequestId>fake</RequestId></ErrorResponse>"
        )
        _reply(handler, 400, xml.encode(), "text/xml")

    def _send_command(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        request = json.loads(body)
        instances = list(request.get("InstanceIds") or [])
        offline = [i for i in instances if i in self.ssm_offline]
        if offline:
            return self._error(handler, "ssm", "InvalidInstanceId", f"Instances {offline} not in a valid state")
        connection = http.client.HTTPConnection(self.moto.url.removeprefix("http://"), timeout=60)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "connection")}
        connection.request("POST", handler.path, body, headers)
        answer = connection.getresponse()
        data = answer.read()
        if answer.status == 200:
            command = json.loads(data)["Command"]["CommandId"]
            for instance in instances:
                self.invocations[(command, instance)] = self._execute(instance, request)
        _reply(handler, answer.status, data, "application/x-amz-json-1.1")

    def _execute(self, instance: str, request: dict[str, Any]) -> Invocation:
        """The script run in the background, as the instance's SSM agent would, after SendCommand answered."""
        invocation = Invocation(instance, "\n".join(request["Parameters"]["commands"]), self.invocation_polls)
        env = {"PATH": os.environ["PATH"], "SPOTMORPH_ETC": str(self.etc(instance))}

        def execute() -> None:
            done = subprocess.run(["sh", "-c", invocation.script], env=env, capture_output=True, text=True, timeout=60)
            invocation.stdout, invocation.stderr = done.stdout, done.stderr
            invocation.status = "Success" if done.returncode == 0 else "Failed"
            invocation.done.set()

        threading.Thread(target=execute, daemon=True).start()
        return invocation

    def _invocation(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        request = json.loads(body)
        found = self.invocations.get((request.get("CommandId"), request.get("InstanceId")))
        if found is None:
            return self._forward(handler, body)
        status = found.status if found.done.is_set() else "InProgress"
        if found.polls_left > 0:
            found.polls_left -= 1
            status = "InProgress"
        document = {
            "CommandId": request["CommandId"],
            "InstanceId": found.instance,
            "DocumentName": "AWS-RunShellScript",
            "Status": status,
            "StatusDetails": status,
            "ResponseCode": 0 if status == "Success" else 1,
            "StandardOutputContent": found.stdout if status != "InProgress" else "",
            "StandardErrorContent": found.stderr if status != "InProgress" else "",
        }
        _reply(handler, 200, json.dumps(document).encode(), "application/x-amz-json-1.1")

    def _activities(self) -> str:
        items = "".join(
            f"<member><ActivityId>launch-{n}</ActivityId><AutoScalingGroupName>{self.group}</AutoScalingGroupName>"
            f"<Description>Launching a new EC2 instance.  Status Reason: {m}</Description><Cause>At a time</Cause>"
            f"<StartTime>2026-01-01T00:00:00Z</StartTime><StatusCode>Failed</StatusCode>"
            f"<StatusMessage>{m}</StatusMessage><Progress>100</Progress></member>"
            for n, m in zip(itertools.count(), self._launches, strict=False)
        )
        return (
            '<DescribeScalingActivitiesResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">'
            f"<DescribeScalingActivitiesResult><Activities>{items}</Activities></DescribeScalingActivitiesResult>"
            "<ResponseMetadata><RequestId>fake</RequestId></ResponseMetadata></DescribeScalingActivitiesResponse>"
        )


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextlib.contextmanager
def moto_session() -> Iterator[MotoServer]:
    """moto's server for a session fixture, warmed (moto imports its EC2 models on the first call: seconds),
    with the AWS configuration of this machine out of the way (no file, no instance metadata)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # a second less: the group's AMI needs no catalogue
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        patch.setenv("AWS_CONFIG_FILE", "/nonexistent/spotmorph-tests")
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/spotmorph-tests")
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            patch.delenv(name, raising=False)
        server = MotoServer()
        try:
            server.client("autoscaling").describe_auto_scaling_groups()  # the services' models, loaded once
            server.client("ec2").describe_launch_templates()
            server.client("ssm").list_commands()
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto a test worker (tests/aws and tests/providers import this fixture into their conftest)."""
    with moto_session() as server:
        yield server
