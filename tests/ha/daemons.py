"""Controller processes for the HA tests: ``spotmorph controller`` on a shared PostgreSQL database, each with a
state directory and a log of its own, started in the root network namespace or (with ``prefix``, ``ip netns
exec NAMESPACE``) in another; the ``daemons`` fixture (tests/ha/conftest.py) kills what a test started."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from controller.client import connection as client
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.helpers import REPO, served_address, write_profile

# Short enough for quick takeovers, long enough that a leader starved of CPU on a loaded 2-core machine (make test
# runs two workers) does not miss its step-down deadline (two thirds of the lease) and step down on its own.
LEASE_SECONDS = 3.0


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    state: Path
    log: Path
    address: str  # '' until the controller has written controller.addr

    def jobs(self) -> rpc.JobsStub:
        token = (self.state / "operator.token").read_text().strip()
        return rpc.JobsStub(client.channel(self.address, token))


def start(
    tmp_path: Path, name: str, url: str, started: list[Daemon], listen: str = "127.0.0.1", prefix: Sequence[str] = ()
) -> Daemon:
    """A controller process named ``name`` listening on ``listen`` (any port), once it says its address; it is in
    ``started`` (the ``daemons`` fixture's list) from its start, so a controller that never comes up is killed too.
    ``prefix`` runs it otherwise (``ip netns exec NAMESPACE``); plaintext is allowed off loopback."""
    state, log = tmp_path / name, tmp_path / f"{name}.log"
    command = [*prefix, sys.executable, "-m", "spotmorph.cli", "controller", "--state-dir", str(state)]
    command += ["--listen", f"{listen}:0", "--database", url, "--lease-seconds", str(LEASE_SECONDS)]
    command += [] if ipaddress.ip_address(listen).is_loopback else ["--allow-plaintext"]
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    daemon = Daemon(process, state, log, "")
    started.append(daemon)
    daemon.address = served_address(process, state, log)
    return daemon


def logs(*daemons: Daemon) -> str:
    """The end of each controller's log, for a failed assertion to show."""
    return "\n".join(f"--- {d.state.name} ({d.address})\n{d.log.read_text()[-4000:]}" for d in daemons)


def until(check: Callable[[], bool], what: str, *daemons: Daemon, seconds: float = 30.0) -> float:
    """Seconds until ``check`` held; fails naming ``what`` and showing the ``daemons``' logs."""
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < seconds, f"not within {seconds} s: {what}\n{logs(*daemons)}"
        time.sleep(0.05)
    return time.monotonic() - began


def job_spec(tmp_path: Path) -> pb.JobSpec:
    return pb.JobSpec(
        name="demo",
        entrypoint=f"{REPO / 'examples' / 'tiny_gpt.py'}:build",
        global_batch=8,
        steps=20,
        checkpoint_dir=str(tmp_path / f"ckpt-{uuid.uuid4().hex[:8]}"),  # one each: a directory is one job's
        profile=str(write_profile(tmp_path)),
    )


def submit(daemon: Daemon, tmp_path: Path) -> grpc.RpcError | str:
    """The new job's id, or the error the controller answered with."""
    try:
        return str(daemon.jobs().SubmitJob(pb.SubmitJobRequest(spec=job_spec(tmp_path)), timeout=10).id)
    except grpc.RpcError as exc:
        return exc


def refused(daemon: Daemon, tmp_path: Path) -> grpc.RpcError:
    """The error a submission to ``daemon`` gets; fails if it took the job."""
    got = submit(daemon, tmp_path)
    assert isinstance(got, grpc.RpcError), f"the old leader took a write: job {got}"
    return got
