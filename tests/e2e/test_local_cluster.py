"""The local cluster's own commands: replay, bad input, and a `down` that leaves nothing running."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import LocalCluster, alive

pytestmark = pytest.mark.slow


def test_without_a_cluster_commands_say_how_to_start_one(cluster: LocalCluster) -> None:
    for args in (["local", "add"], ["local", "kill", "node-1"], ["local", "down"]):
        out = cluster.cli(*args, check=False)
        assert out.returncode == 2, args
        assert "spotmorph local up" in out.stderr


def test_replay_follows_the_trace_and_down_cleans_everything(cluster: LocalCluster, tmp_path: Path) -> None:
    cluster.up(nodes=1, slots=1)
    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,a\n1000,add,b\n2000,add,c\n3000,remove,b\n4000,remove,c\n")
    cluster.cli("local", "replay", str(trace), "--speedup", "1", "--max-nodes", "3", "--notice", "0", timeout=60)

    def live() -> list[str]:
        return sorted(n["name"] for n in cluster.nodes() if n["state"] in {"READY", "ASSIGNED"})

    cluster.wait(lambda: len(live()) == 1, 30, "the replay's removals to take effect")
    gone = cluster.cli("local", "kill", "node-9", check=False)
    assert gone.returncode == 2 and "not running here" in gone.stderr
    bad = cluster.cli("local", "preempt", live()[0], "--notice", "-3", check=False)
    assert bad.returncode == 2 and "--notice" in bad.stderr

    pids = [int(p.read_text()) for p in cluster.cluster.rglob("*.pid")]
    assert pids
    cluster.cli("local", "down")
    cluster.wait(lambda: not any(alive(pid) for pid in pids), 30, "every process to end")
    assert not cluster.cluster.exists()
    assert not (cluster.home / "context.json").exists()
