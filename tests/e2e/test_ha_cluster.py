"""Two controllers on PostgreSQL running a real local cluster: the leader is SIGKILLed mid-training (`spotmorph local
kill-leader`) and the standby takes over; with no leader at all, a node gets an eviction notice, its agent acts
on its own and the next leader morphs. No step is lost and the result equals the uninterrupted 1-process run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from controller.eventlog.facts import LeaderElected
from controller.persistence import leases
from controller.persistence.schema import assignments, decisions
from controller.persistence.store import Store
from spotmorph.local.harness import LocalCluster

from .test_elastic import SHORT_STEPS, assert_equals_reference, submit

pytestmark = pytest.mark.slow
# postgres_url comes first in each test's arguments: its database is dropped after the cluster's teardown read it.


def lease_epoch(url: str) -> int:
    store = Store(url)
    try:
        lease = leases.current(store.engine)
        return 0 if lease is None else lease.epoch
    finally:
        store.close()


def assert_fenced_history(url: str) -> None:
    """Every decision carries its epoch, epochs never go back, and no node got ranks of one generation twice."""
    store = Store(url)
    try:
        with store.engine.connect() as conn:
            epochs = list(conn.execute(select(decisions.c.epoch).order_by(decisions.c.decision)).scalars())
            placed = list(conn.execute(select(assignments.c.job, assignments.c.generation, assignments.c.node)))
    finally:
        store.close()
    assert None not in epochs and epochs == sorted(epochs), f"decisions' epochs: {epochs}"
    assert len(placed) == len(set(placed))


# In `make soak` (50 s of training): make test keeps SIGKILL and SIGSTOP of real controller processes on a real
# PostgreSQL (tests/ha/test_failover.py), the agents' epoch fence and leader finding (tests/agent/test_leaders.py),
# and a controller killed -9 while running and while morphing (tests/controller/test_kill9.py); bench/failover_bench.py
# measures it.
@pytest.mark.soak
def test_sigkill_of_the_leader_mid_training_loses_no_step(
    postgres_url: str, cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=2, controllers=2, database=postgres_url)
    first, second = cluster.context().addresses()
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints, SHORT_STEPS)
    cluster.wait_step(job, 30, 120)
    assert cluster.kill_leader() == first
    killed = time.monotonic()
    cluster.wait(lambda: lease_epoch(postgres_url) == 2, 30, f"{second} to take the lease")
    print(f"the standby took the lease {time.monotonic() - killed:.1f} s after SIGKILL")
    elected = [(e.fact.epoch, e.fact.address) for e in cluster.facts(LeaderElected)]
    assert elected == [(1, first), (2, second)]
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 240)
    assert final["state"] == "SUCCEEDED", final
    assert final["steps_lost"] == 0 and final["restarts"] == 0
    assert final["generation"] == 1, "a change of leader is not a morph"
    assert_fenced_history(postgres_url)
    assert_equals_reference(checkpoints, references, SHORT_STEPS)


# In `make soak`: make test keeps the agent acting alone on a notice with no controller (tests/agent/test_no_leader.py)
# and the next leader morphing such a generation as an eviction (tests/controller/test_reconcile.py).
@pytest.mark.soak
def test_an_eviction_with_no_leader_is_handled_by_the_agent_then_by_the_next_leader(
    postgres_url: str, cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=3, controllers=2, database=postgres_url)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints, SHORT_STEPS)
    cluster.wait_step(job, 30, 120)
    victim = cluster.job_nodes(job)[-1]
    cluster.kill_leader()
    standby = cluster.files.controller_files(2)
    cluster.cli("local", "preempt", victim, "--notice", "30")  # while no controller leads: the lease still runs
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    assert final["steps_lost"] == 0 and final["restarts"] == 0, final
    assert any("eviction" in m["cause"] for m in final["morphs"]), final["morphs"]
    assert "LEADING" in standby.log.read_text()
    assert_fenced_history(postgres_url)
    assert_equals_reference(checkpoints, references, SHORT_STEPS)


# In `make soak` (about a minute): tests/ha/test_failover.py pauses a leader process past its lease in every make
# test (its next write refused, it stands by); here a paused leader's agents move to the new one, and after
# SIGCONT no node acts on its stale replies while the job morphs under the new leader.
@pytest.mark.soak
def test_a_paused_leader_comes_back_fenced_while_its_cluster_morphs(
    postgres_url: str, cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=3, controllers=2, database=postgres_url)
    checkpoints = tmp_path / "ckpt"
    job = submit(cluster, checkpoints)  # the long job: it must not end during the pause
    cluster.wait_step(job, 30, 120)
    first = cluster.files.controller_files(1)
    pid = int(first.pid_file.read_text())
    os.killpg(pid, signal.SIGSTOP)
    try:
        cluster.wait(lambda: lease_epoch(postgres_url) == 2, 30, "the standby to take the paused leader's lease")
        victim = cluster.job_nodes(job)[-1]
        cluster.cli("local", "preempt", victim, "--notice", "20")
        cluster.wait(lambda: cluster.status(job)["generation"] >= 2, 120, "a morph under the new leader")
    finally:
        os.killpg(pid, signal.SIGCONT)
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    assert final["steps_lost"] == 0 and final["restarts"] == 0, final
    assert "LEADING -> STANDBY" in first.log.read_text()
    assert_fenced_history(postgres_url)
    assert_equals_reference(checkpoints, references)
