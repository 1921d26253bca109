"""A real controller process killed with SIGKILL while a job runs and while it morphs, then restarted.

Agents are simulated in the test as real gRPC clients. The job must carry on: no step lost, no
generation issued twice. On failure the controller's event log is printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.api.auth import issue_vm_token
from controller.client import connection as client
from controller.persistence.store import Store
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from spotmorph.local.processes import port_range_base
from tests.controller.helpers import REPO

pytestmark = pytest.mark.slow


def _port() -> int:
    """Below the ephemeral range: no outgoing connection holds it when the restarted daemon listens again."""
    return port_range_base(1)


class Daemon:
    def __init__(self, state: Path, token_file: Path) -> None:
        self.state, self.token_file, self.port = state, token_file, _port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [sys.executable, "-m", "spotmorph.cli", "controller", "--state-dir", str(self.state)]
        args += ["--listen", self.address, "--token-file", str(self.token_file), "--debounce-seconds", "1"]
        log = (self.state.parent / "controller.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(self.address))
        wait_for(lambda: _serving(health), "controller serving")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "SPOTMORPH_CONTROLLER": self.address,
            "SPOTMORPH_TOKEN": self.token_file.read_text().strip(),
        }
        command = [sys.executable, "-m", "spotmorph.cli", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)

    def event_log(self) -> str:
        store = Store(self.state / "state.db")
        try:
            return "\n".join(f"{e.seq} {e.kind} job={e.job} node={e.node} {e.data}" for e in store.events(limit=5000))
        finally:
            store.close()


def _serving(health: Any) -> bool:
    try:
        return bool(health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1)
    except grpc.RpcError:
        return False


def wait_for(condition: Callable[[], object], what: str, deadline: float = 30.0) -> Any:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class SimAgent:
    """One node: registers once, heartbeats its trainers' state, obeys the newest assignment."""

    def __init__(self, daemon: Daemon, agent_token: str) -> None:
        self.daemon = daemon
        reply = rpc.AgentStub(client.channel(daemon.address, agent_token)).Register(
            pb.RegisterRequest(slots=1, address="127.0.0.1")
        )
        self.name, self.incarnation, self.token = reply.node_name, reply.incarnation, reply.node_token
        self.trainers: list[pb.TrainerStatus] = []
        self.notice: float | None = None

    def beat(self) -> pb.Assignment | None:
        stub = rpc.AgentStub(client.channel(self.daemon.address, self.token))
        request = pb.HeartbeatRequest(node_name=self.name, incarnation=self.incarnation, trainers=self.trainers)
        if self.notice is not None:
            request.eviction.CopyFrom(pb.EvictionNotice(not_before=self.notice, source="test"))
        try:
            reply = stub.Heartbeat(request, timeout=5)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                return None
            raise
        return reply.assignment if reply.HasField("assignment") else None

    def run(self, assignment: pb.Assignment, step: int, ckpt: int, running: bool = True) -> None:
        self.trainers = [
            pb.TrainerStatus(
                job=assignment.job,
                generation=assignment.generation,
                rank=r,
                running=running,
                last_step=step,
                last_checkpoint_step=ckpt,
                exit_code=None if running else 0,
            )
            for r in assignment.ranks
        ]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "state", tmp_path / "operator.token")
    d.start()
    try:
        yield d
    except BaseException:
        print("controller event log:\n" + d.event_log())
        raise
    finally:
        if d.proc and d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(20) == 0, "SIGTERM must end the controller with exit 0"


def test_kill9_while_running_and_while_morphing(daemon: Daemon, request: pytest.FixtureRequest) -> None:
    try:
        _scenario(daemon)
    except BaseException:
        print("controller event log:\n" + daemon.event_log())
        raise


def _status(daemon: Daemon, job_id: str) -> dict[str, Any]:
    done = daemon.cli("status", job_id, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _scenario(daemon: Daemon) -> None:
    submitted = daemon.cli("submit", "examples/tiny_gpt.yaml", "--set", "steps=50", "--json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    agents = [SimAgent(daemon, issue_vm_token(daemon.state, f"sim-vm-{i}")) for i in range(4)]

    def admitted() -> dict[str, pb.Assignment] | None:
        for a in agents:
            a.beat()
        if _status(daemon, job_id)["state"] != "RUNNING":
            return None
        # a whole round after admission: a round that straddles it would see only some assignments
        got = {a.name: a.beat() for a in agents}
        return {name: x for name, x in got.items() if x is not None} or None

    assignments = wait_for(admitted, "admission after the debounce window")
    assert {x.generation for x in assignments.values()} == {1} and len(assignments) >= 2
    working = [a for a in agents if a.name in assignments]
    for a in working:
        a.run(assignments[a.name], step=12, ckpt=10)
        a.beat()
    wait_for(lambda: _status(daemon, job_id)["last_checkpoint_step"] == 10, "checkpoint 10 recorded")

    daemon.kill9()  # while running
    daemon.start()
    for a in working:
        got = wait_for(a.beat, "assignment after restart")
        assert got.generation == 1 and got.action == pb.ACTION_RUN
    status = _status(daemon, job_id)
    assert status["state"] == "RUNNING" and status["generation"] == 1 and status["last_checkpoint_step"] == 10

    victim = working[-1]
    victim.notice = time.time() + 60
    stop = victim.beat()
    assert stop is not None and stop.action == pb.ACTION_STOP
    assert _status(daemon, job_id)["state"] == "MORPHING"

    daemon.kill9()  # while morphing
    daemon.start()
    assert _status(daemon, job_id)["state"] == "MORPHING"
    for a in working:  # trainers agreed on step 13, checkpointed it and exited
        a.run(assignments[a.name], step=13, ckpt=13, running=False)
    new: dict[str, pb.Assignment] = {}

    def converged() -> bool:
        for a in working:
            got = a.beat()
            if got is not None and got.generation == 2:
                new[a.name] = got
        return _status(daemon, job_id)["generation"] == 2 and len(new) == len(
            {s[0] for s in json.loads(next(iter(new.values())).layout.json)["placement"]} if new else {0}
        )

    wait_for(converged, "generation 2 on every node that has a part in it")
    status = _status(daemon, job_id)
    assert status["state"] == "RUNNING" and status["steps_lost"] == 0 and victim.name not in new
    assert [m["generation"] for m in status["morphs"]] == [2]
    assert all(x.resume_step == 13 for x in new.values())
    store = Store(daemon.state / "state.db")
    try:
        assert [g.generation for g in store.generations(job_id)] == [1, 2]
    finally:
        store.close()
    nodes = json.loads(daemon.cli("nodes", "--json").stdout)
    assert {n["name"] for n in nodes} == {a.name for a in agents} and all("slots" in n and "job" in n for n in nodes)
