"""Two controller processes on one PostgreSQL server: SIGKILL of the leader hands over within the lease, and a
leader paused past its lease (SIGSTOP) comes back fenced: its next write is refused, it stands by, and every
decision after the takeover carries the new epoch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from controller.client import connection as client
from controller.persistence import leases
from controller.persistence.schema import decisions
from controller.persistence.store import Store
from protos.reasons import leader_of, reason_of
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.helpers import REPO, write_profile

pytestmark = pytest.mark.slow
LEASE_SECONDS = 2.0


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    state: Path
    log: Path
    address: str

    def jobs(self) -> rpc.JobsStub:
        token = (self.state / "operator.token").read_text().strip()
        return rpc.JobsStub(client.channel(self.address, token))


def start(tmp_path: Path, name: str, url: str, started: list[Daemon]) -> Daemon:
    state, log = tmp_path / name, tmp_path / f"{name}.log"
    command = [sys.executable, "-m", "spotmorph.cli", "controller", "--state-dir", str(state)]
    command += ["--listen", "127.0.0.1:0", "--database", url, "--lease-seconds", str(LEASE_SECONDS)]
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + 60
    while not (state / "controller.addr").exists():
        assert process.poll() is None, f"controller {name} exited {process.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no controller.addr from {name}:\n{log.read_text()}"
        time.sleep(0.05)
    daemon = Daemon(process, state, log, (state / "controller.addr").read_text().strip())
    started.append(daemon)
    return daemon


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for daemon in started:
            if daemon.process.poll() is None:
                os.kill(daemon.process.pid, signal.SIGCONT)
                daemon.process.kill()
                daemon.process.wait(10)


def job_spec(tmp_path: Path) -> pb.JobSpec:
    return pb.JobSpec(
        name="demo",
        entrypoint=f"{REPO / 'examples' / 'tiny_gpt.py'}:build",
        global_batch=8,
        steps=20,
        checkpoint_dir=str(tmp_path / f"ckpt-{uuid.uuid4().hex[:8]}"),  # one each: a directory is one job's
        profile=str(write_profile(tmp_path)),
    )


def until(check: Callable[[], bool], what: str, seconds: float, logs: list[Daemon]) -> float:
    """Seconds until ``check`` held; fails naming ``what`` and printing the controllers' logs."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > seconds:
            shown = "\n".join(f"--- {d.state.name}\n{d.log.read_text()[-3000:]}" for d in logs)
            raise AssertionError(f"not within {seconds} s: {what}\n{shown}")
        time.sleep(0.05)
    return time.monotonic() - began


def lease_epoch(store: Store) -> int:
    lease = leases.current(store.engine)
    return 0 if lease is None else lease.epoch


def submit(daemon: Daemon, tmp_path: Path) -> grpc.RpcError | str:
    try:
        return str(daemon.jobs().SubmitJob(pb.SubmitJobRequest(spec=job_spec(tmp_path)), timeout=10).id)
    except grpc.RpcError as exc:
        return exc


def test_sigkill_of_the_leader_hands_over_within_the_lease(
    tmp_path: Path, postgres_url: str, daemons: list[Daemon]
) -> None:
    first = start(tmp_path, "a", postgres_url, daemons)
    second = start(tmp_path, "b", postgres_url, daemons)
    store = Store(postgres_url)
    try:
        assert lease_epoch(store) == 1 and leases.current(store.engine).address == first.address  # type: ignore[union-attr]
        job = submit(first, tmp_path)
        assert isinstance(job, str), job
        first.process.kill()
        took = until(lambda: isinstance(submit(second, tmp_path), str), "the standby leads", 15, daemons)
        print(f"the standby took writes {took:.1f} s after SIGKILL (lease {LEASE_SECONDS} s)")
        assert lease_epoch(store) == 2
        listed = [j.id for j in second.jobs().ListJobs(pb.ListJobsRequest()).jobs]
        assert job in listed and len(listed) == 2
    finally:
        store.close()


def test_a_paused_leader_is_fenced_when_it_resumes(tmp_path: Path, postgres_url: str, daemons: list[Daemon]) -> None:
    first = start(tmp_path, "a", postgres_url, daemons)
    second = start(tmp_path, "b", postgres_url, daemons)
    store = Store(postgres_url)
    try:
        assert isinstance(submit(first, tmp_path), str)
        os.kill(first.process.pid, signal.SIGSTOP)
        until(lambda: lease_epoch(store) == 2, "the standby takes the lease of a paused leader", 15, daemons)
        taken_at = time.time()
        assert isinstance(submit(second, tmp_path), str)
        os.kill(first.process.pid, signal.SIGCONT)
        refused = submit(first, tmp_path)  # whether its write reached the database or its gate first: refused
        assert isinstance(refused, grpc.RpcError), f"a deposed leader took a write: job {refused}"
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(refused.trailing_metadata()) == "not-leader"
        named = lambda: leader_of(_refusal(first, tmp_path).trailing_metadata()) == second.address  # noqa: E731
        until(named, "the old leader names the new one", 10, daemons)
        assert "stepping down" in first.log.read_text() or "LEADING -> STANDBY" in first.log.read_text()
        with store.engine.connect() as conn:
            rows = conn.execute(select(decisions.c.epoch).order_by(decisions.c.decision)).scalars().all()
        assert set(rows) <= {1, 2} and rows == sorted(rows), f"a decision of epoch 1 after epoch 2: {rows}"
        assert len(second.jobs().ListJobs(pb.ListJobsRequest()).jobs) == 2
        assert taken_at > 0
    finally:
        store.close()


def _refusal(daemon: Daemon, tmp_path: Path) -> grpc.RpcError:
    got = submit(daemon, tmp_path)
    assert isinstance(got, grpc.RpcError), f"the old leader took a write: job {got}"
    return got
