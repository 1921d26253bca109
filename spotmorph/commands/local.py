"""``spotmorph local``: an embedded cluster on this machine (controller, agents, an IMDS "platform").

``up`` starts a controller on loopback with generated tokens, a local Scheduled Events service and
N agent processes with K CPU slots each, and writes the client context so that plain ``spotmorph
jobs`` talks to it. ``preempt`` announces an eviction through the same IMDS protocol Azure uses;
when its ``NotBefore`` passes (or the agent acknowledges it) the platform kills the "VM". ``kill``
ends a VM without notice; ``replay`` drives adds and evictions from a trace; ``down`` stops
everything and removes the cluster's files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from controller.client.context import Context, read_context, remove_context, spotmorph_home, write_context
from controller.providers.local import LocalProcessProvider, LocalVm, kill_vm
from morphing.errors import UserInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="local_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start a local cluster")
    up.add_argument("--nodes", type=int, default=2, help="agent processes (default 2)")
    up.add_argument("--slots", type=int, default=2, help="CPU slots per node (default 2)")
    up.add_argument("--heartbeat-expiry", type=float, default=6.0, help="seconds before a silent node is LOST")
    up.add_argument("--debounce", type=float, default=3.0, help="seconds to wait after arrivals before growing")
    add = sub.add_parser("add", help="add nodes")
    add.add_argument("count", type=int, nargs="?", default=1)
    preempt = sub.add_parser("preempt", help="evict a node with notice (Scheduled Events)")
    preempt.add_argument("node")
    preempt.add_argument("--notice", type=float, default=30.0, metavar="SECONDS")
    kill = sub.add_parser("kill", help="evict a node without notice")
    kill.add_argument("node")
    replay = sub.add_parser("replay", help="drive the cluster from an availability trace")
    replay.add_argument("trace")
    replay.add_argument("--speedup", type=float, default=60.0, help="trace seconds per wall second")
    replay.add_argument("--max-nodes", type=int, default=4, help="scale the trace to at most this many nodes")
    replay.add_argument("--notice", type=float, default=30.0, help="eviction notice in trace seconds (0: kill)")
    sub.add_parser("down", help="stop everything and clean up")
    platform = sub.add_parser("platform", help=argparse.SUPPRESS)
    platform.add_argument("--cluster-dir", type=Path, required=True)
    platform.add_argument("--port", type=int, required=True)


def run(args: argparse.Namespace) -> int:
    action = args.local_command
    if action == "platform":
        return _platform(args.cluster_dir, args.port)
    if action == "up":
        return _up(args)
    context = _context()
    provider = _provider(context)
    if action == "add":
        if args.count < 1:
            raise UserInputError(f"add {args.count}: add at least 1 node")
        provider.start(args.count)
        print(f"starting {args.count} node(s); they appear in `spotmorph nodes` once registered")
        return 0
    if action == "preempt":
        if args.notice < 0:
            raise UserInputError(f"--notice {args.notice}: it must be >= 0 seconds")
        _require_node(provider, args.node)
        event = _schedule_eviction(context.imds_url, args.node, args.notice)
        print(f"eviction {event} of {args.node} announced with {args.notice:.0f}s notice")
        return 0
    if action == "kill":
        vm = _require_node(provider, args.node)
        kill_vm(vm)
        print(f"{args.node} killed without notice")
        return 0
    if action == "replay":
        return _replay(args, context, provider)
    return _down(context)


def _context() -> Context:
    context = read_context()
    if context is None or not context.cluster_dir:
        raise UserInputError("no local cluster is up; start one with `spotmorph local up`")
    return context


def _provider(context: Context) -> LocalProcessProvider:
    return LocalProcessProvider(
        Path(context.cluster_dir),
        context.controller,
        Path(context.agent_token_file),
        context.slots,
        context.imds_url,
    )


def _require_node(provider: LocalProcessProvider, node: str) -> LocalVm:
    vm = provider.find(node)
    if vm is None or not vm.alive():
        known = sorted(n for v in provider.vms() if v.alive() and (n := v.node_name))
        raise UserInputError(f"node {node!r} is not running here; running nodes: {', '.join(known) or 'none'}")
    return vm


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn(args: list[str], log: Path) -> int:
    with open(log, "ab") as handle:
        process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    return process.pid


def _up(args: argparse.Namespace) -> int:
    if args.nodes < 0 or args.slots < 1:
        raise UserInputError("--nodes must be >= 0 and --slots >= 1")
    existing = read_context()
    if existing is not None and existing.cluster_dir and _alive(Path(existing.cluster_dir) / "controller.pid"):
        raise UserInputError("a local cluster is already up; run `spotmorph local down` first")
    cluster = spotmorph_home() / "local"
    shutil.rmtree(cluster, ignore_errors=True)
    state = cluster / "state"
    state.mkdir(parents=True)
    controller_port, imds_port = _free_port(), _free_port()
    address = f"127.0.0.1:{controller_port}"
    settings = {
        "heartbeat_expiry_seconds": args.heartbeat_expiry,
        "debounce_seconds": args.debounce,
        "rendezvous_port_base": _free_port(),
        # A local morph is a process restart (bench/morph_bench.py measures it), not a VM boot.
        "morph_cost_seconds": 8.0,
    }
    (cluster / "controller.yaml").write_text(json.dumps(settings))
    python = [sys.executable, "-m", "spotmorph.cli"]
    controller_args = [*python, "controller", "--state-dir", str(state), "--listen", address]
    (cluster / "controller.json").write_text(
        json.dumps([*controller_args, "--config", str(cluster / "controller.yaml")])
    )
    start_controller(cluster)
    platform_pid = _spawn(
        [*python, "local", "platform", "--cluster-dir", str(cluster), "--port", str(imds_port)],
        cluster / "platform.log",
    )
    (cluster / "platform.pid").write_text(str(platform_pid))
    token_file, agent_token = state / "operator.token", state / "agent.token"
    _wait(
        lambda: token_file.exists() and agent_token.exists(), 60, "the controller to start", cluster / "controller.log"
    )
    context = Context(
        controller=address,
        token_file=str(token_file),
        cluster_dir=str(cluster),
        imds_url=f"http://127.0.0.1:{imds_port}",
        agent_token_file=str(agent_token),
        slots=args.slots,
    )
    write_context(context)
    provider = _provider(context)
    provider.start(args.nodes)
    _wait(lambda: len([v for v in provider.vms() if v.node_name]) >= args.nodes, 90, "the nodes to register", None)
    names = ", ".join(v.node_name or "?" for v in provider.vms())
    print(f"local cluster up: controller {address}, nodes {names or 'none'} ({args.slots} slots each)")
    print(f"files in {cluster}; try `spotmorph nodes`, `spotmorph submit examples/tiny_gpt.yaml`")
    return 0


def start_controller(cluster: Path) -> int:
    """Start (or restart, after a crash) the cluster's controller with its recorded command line."""
    pid = _spawn(json.loads((cluster / "controller.json").read_text()), cluster / "controller.log")
    (cluster / "controller.pid").write_text(str(pid))
    return pid


def _wait(condition: Callable[[], bool], timeout: float, what: str, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.1)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def _schedule_eviction(imds_url: str, node: str, notice: float) -> str:
    body = json.dumps({"EventType": "Preempt", "Resources": [node], "NoticeSeconds": notice}).encode()
    request = urllib.request.Request(f"{imds_url}/admin/events", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(json.loads(response.read())["EventId"])


def _platform(cluster: Path, port: int) -> int:
    """The local "cloud": serves Scheduled Events and evicts VMs whose eviction has started."""
    from worker_agent.scheduled_events_server import ScheduledEventsServer

    server = ScheduledEventsServer(port=port).start()
    provider = LocalProcessProvider(cluster, "", Path())
    running = True

    def stop(signum: int, frame: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while running:
        server.state.document()
        for event in server.state.admin_view():
            if event["EventStatus"] == "Started" and event["EventType"] in ("Preempt", "Terminate"):
                for node in event["Resources"]:
                    vm = provider.find(node)
                    if vm is not None and vm.alive():
                        kill_vm(vm)
                        print(f"evicted {node} (event {event['EventId']})", flush=True)
                server.state.remove(event["EventId"])
        time.sleep(0.2)
    server.stop()
    return 0


def _replay(args: argparse.Namespace, context: Context, provider: LocalProcessProvider) -> int:
    from morphing.traces import parse_trace

    path = Path(args.trace)
    try:
        trace = parse_trace(path.read_text(), what=f"trace {path}")
    except OSError as exc:
        raise UserInputError(f"trace {path} cannot be read ({exc.strerror})") from None
    if args.speedup <= 0 or args.max_nodes < 1:
        raise UserInputError("--speedup must be > 0 and --max-nodes >= 1")
    peak = max((n for _, n in trace.availability()), default=1) or 1
    start = time.monotonic()
    for seconds, count in trace.availability():
        delay = seconds / args.speedup - (time.monotonic() - start)
        if delay > 0:
            time.sleep(delay)
        live = [v for v in provider.vms() if v.alive()]
        want = round(count * args.max_nodes / peak)
        if want > len(live):
            provider.start(want - len(live))
            print(f"t={seconds:>8.0f}s  +{want - len(live)} node(s)", flush=True)
        for vm in reversed(live[want:] if want < len(live) else []):
            if args.notice > 0 and vm.node_name:
                _schedule_eviction(context.imds_url, vm.node_name, args.notice / args.speedup)
            else:
                kill_vm(vm)
            print(f"t={seconds:>8.0f}s  evict {vm.node_name or vm.directory.name}", flush=True)
    return 0


def _down(context: Context) -> int:
    cluster = Path(context.cluster_dir)
    for name in ("controller.pid", "platform.pid"):
        _terminate(cluster / name)
    for vm in _provider(context).vms():
        kill_vm(vm)
    remove_context()
    shutil.rmtree(cluster, ignore_errors=True)
    print("local cluster stopped and cleaned up")
    return 0


def _terminate(pid_file: Path, grace: float = 15.0) -> None:
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
