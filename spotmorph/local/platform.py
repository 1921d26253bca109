"""The local "cloud": a process that serves the cloud's metadata service and evicts VMs as that cloud does.

``spotmorph local up`` starts it (``spotmorph local platform --cluster-dir D --port P``, a hidden command) as the
cloud the cluster plays (``--cloud``, kept in its ``cloud`` file: :mod:`.clouds`):

- azure: Scheduled Events (:mod:`.imds_server`); ``local preempt`` schedules a ``Preempt`` event, and once it has
  started (its ``NotBefore`` passed, or the agent acknowledged it) the platform kills the VM;
- aws: IMDSv2 (:mod:`.aws_metadata`); ``local preempt`` schedules a Spot interruption (``instance-action``), and
  the VM is killed at its time; ``local rebalance`` recommends a rebalance, the early warning;
- gcp: the metadata server (:mod:`.gcp_metadata`); ``local preempt`` sets ``preempted`` and, as GCP's ACPI
  shutdown does, sends the VM's agent a SIGTERM; the VM is killed once its agent exited or the notice is up.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from spotmorph.local.aws_metadata import AwsMetadataServer, AwsMetadataState
from spotmorph.local.clouds import require_warning
from spotmorph.local.gcp_metadata import GcpMetadataServer, GcpMetadataState
from spotmorph.local.imds_server import ScheduledEventsServer, ScheduledEventsState
from spotmorph.local.layout import ClusterDir
from spotmorph.local.provider import LocalProcessProvider, LocalVm, kill_vm
from worker_agent.notices.facts import Cloud

EVICTIONS = ("Preempt", "Terminate")


def command(cluster: ClusterDir, port: int, host: str = "127.0.0.1") -> list[str]:
    """The platform process's command line (serving on ``host:port``)."""
    python = [sys.executable, "-m", "spotmorph.cli"]
    return [*python, "local", "platform", "--cluster-dir", str(cluster.root), "--host", host, "--port", str(port)]


def schedule_eviction(imds_url: str, node: str, notice: float, event_type: str = "Preempt") -> str:
    """Announce that ``node`` will be evicted in ``notice`` seconds; returns the event's id."""
    body = json.dumps({"EventType": event_type, "Resources": [node], "NoticeSeconds": notice}).encode()
    request = urllib.request.Request(f"{imds_url}/admin/events", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(json.loads(response.read())["EventId"])


def evict_started(state: ScheduledEventsState, provider: LocalProcessProvider) -> list[str]:
    """Kill the VMs of every started eviction, remove those events; returns what was evicted (for the log)."""
    state.document()  # starts the events whose NotBefore has passed
    done = []
    for event in state.admin_view():
        if event["EventStatus"] == "Started" and event["EventType"] in EVICTIONS:
            for node in event["Resources"]:
                vm = provider.find(node)
                if vm is not None and vm.alive():
                    kill_vm(vm)
                    done.append(f"evicted {node} (event {event['EventId']})")
            state.remove(event["EventId"])
    return done


def announce_eviction(cloud: Cloud, imds_url: str, vm: str, node: str, notice: float) -> str:
    """Announce that VM ``vm`` (node ``node``) goes in ``notice`` seconds, the way ``cloud`` does; returns what was
    announced, for the user."""
    if cloud == "aws":
        body = {"vm": vm, "action": "terminate", "notice_seconds": notice}
        return f"Spot interruption (terminate at {_admin(imds_url, '/admin/instance-action', body)['time']})"
    if cloud == "gcp":
        _admin(imds_url, "/admin/preempt", {"vm": vm, "notice_seconds": notice})
        return "preemption (preempted is TRUE, the guest shuts down)"
    return f"eviction {schedule_eviction(imds_url, node, notice)}"


def announce_risk(cloud: Cloud, imds_url: str, vm: str) -> str:
    """The cloud's early warning that ``vm`` is at elevated risk of eviction (AWS's rebalance recommendation); a
    UserInputError on a cloud that has none spotmorph reads."""
    require_warning(cloud)
    return f"rebalance recommendation (noticeTime {_admin(imds_url, '/admin/rebalance', {'vm': vm})['noticeTime']})"


def _admin(imds_url: str, path: str, body: dict[str, object]) -> dict[str, str]:
    request = urllib.request.Request(f"{imds_url}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        return {str(k): str(v) for k, v in json.loads(response.read()).items()}


def evict_interrupted(state: AwsMetadataState, provider: LocalProcessProvider) -> list[str]:
    """Kill every VM whose Spot interruption's time has come (AWS takes no acknowledgement)."""
    done = []
    for name in state.due():
        vm = LocalVm(provider.files.vms / name)
        if vm.alive():
            kill_vm(vm)
            done.append(f"interrupted {vm.node_name or name} (Spot instance-action)")
        state.forget(name)
    return done


def shut_down_preempted(
    state: GcpMetadataState, provider: LocalProcessProvider, clock: Callable[[], float] = time.time
) -> list[str]:
    """GCP's preemption after the metadata: the guest's shutdown (a SIGTERM to the agent, once), then the VM
    stops once its agent exited or the notice is up."""
    done = []
    for name, preemption in state.preempted().items():
        vm = LocalVm(provider.files.vms / name)
        if not preemption.signalled:
            state.mark_signalled(name)
            if vm.pid is not None and vm.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(vm.pid, signal.SIGTERM)  # the agent alone: systemd's KillMode=mixed
                done.append(f"shutting down {vm.node_name or name} (preempted: SIGTERM to its agent)")
            continue
        if not vm.alive() or (preemption.stop_at is not None and clock() >= preemption.stop_at):
            how = "its agent exited" if not vm.alive() else "the notice is up"
            kill_vm(vm)
            state.forget(name)
            done.append(f"preempted {vm.node_name or name} ({how})")
    return done


def serve(cluster_dir: Path, port: int, host: str = "127.0.0.1", poll: float = 0.2) -> int:
    """The platform process, as the cloud the cluster plays: runs until SIGTERM or SIGINT."""
    provider = LocalProcessProvider(cluster_dir, "")
    server: ScheduledEventsServer | AwsMetadataServer | GcpMetadataServer
    step: Callable[[], list[str]]
    if provider.cloud == "aws":
        server = AwsMetadataServer(host, port).start()
        step = functools.partial(evict_interrupted, server.state, provider)
    elif provider.cloud == "gcp":
        server = GcpMetadataServer(host, port).start()
        step = functools.partial(shut_down_preempted, server.state, provider, clock=time.time)
    else:
        server = ScheduledEventsServer(host, port).start()
        step = functools.partial(evict_started, server.state, provider)
    running = True

    def stop(signum: int, frame: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while running:
        for line in step():
            print(line, flush=True)
        time.sleep(poll)
    server.stop()
    return 0
