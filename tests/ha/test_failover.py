"""Two controller processes on one PostgreSQL server: SIGKILL of the leader hands over within the lease, and a
leader paused past its lease (SIGSTOP) comes back fenced: its next write is refused, it stands by, and every
decision after the takeover carries the new epoch."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from controller.persistence import leases
from controller.persistence.schema import decisions
from controller.persistence.store import Store
from protos.reasons import leader_of, reason_of
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.ha.daemons import LEASE_SECONDS, Daemon, refused, start, submit, until

pytestmark = pytest.mark.slow


def lease_epoch(store: Store) -> int:
    lease = leases.current(store.engine)
    return 0 if lease is None else lease.epoch


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
        took = until(lambda: isinstance(submit(second, tmp_path), str), "the standby leads", *daemons, seconds=15)
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
        until(lambda: lease_epoch(store) == 2, "the standby takes the lease of a paused leader", *daemons, seconds=15)
        taken_at = time.time()
        assert isinstance(submit(second, tmp_path), str)
        os.kill(first.process.pid, signal.SIGCONT)
        refusal = refused(first, tmp_path)  # whether its write reached the database or its gate first: refused
        assert refusal.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(refusal.trailing_metadata()) == "not-leader"
        named = lambda: leader_of(refused(first, tmp_path).trailing_metadata()) == second.address  # noqa: E731
        until(named, "the old leader names the new one", *daemons, seconds=10)
        assert "stepping down" in first.log.read_text() or "LEADING -> STANDBY" in first.log.read_text()
        with store.engine.connect() as conn:
            rows = conn.execute(select(decisions.c.epoch).order_by(decisions.c.decision)).scalars().all()
        assert set(rows) <= {1, 2} and rows == sorted(rows), f"a decision of epoch 1 after epoch 2: {rows}"
        assert len(second.jobs().ListJobs(pb.ListJobsRequest()).jobs) == 2
        assert taken_at > 0
    finally:
        store.close()
