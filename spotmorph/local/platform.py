"""The local "cloud": a process that serves Scheduled Events and evicts VMs whose eviction has started.

``spotmorph local up`` starts it (``spotmorph local platform --cluster-dir D --port P``, a hidden
command). ``spotmorph local preempt`` schedules an event through its admin endpoint
(:func:`schedule_eviction`); agents read the event through the IMDS protocol, as on Azure. Once the
event has started (its ``NotBefore`` passed, or the agent acknowledged it), the platform kills the VM.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from pathlib import Path

from spotmorph.local.imds_server import ScheduledEventsServer, ScheduledEventsState
from spotmorph.local.layout import ClusterDir
from spotmorph.local.provider import LocalProcessProvider, kill_vm

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


def serve(cluster_dir: Path, port: int, host: str = "127.0.0.1", poll: float = 0.2) -> int:
    """The platform process: runs until SIGTERM or SIGINT."""
    server = ScheduledEventsServer(host, port).start()
    provider = LocalProcessProvider(cluster_dir, "")
    running = True

    def stop(signum: int, frame: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while running:
        for line in evict_started(server.state, provider):
            print(line, flush=True)
        time.sleep(poll)
    server.stop()
    return 0
