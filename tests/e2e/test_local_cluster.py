"""The local cluster's own commands: replay, bad input, and a `down` that leaves nothing running."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.tokens import issue_vm_token
from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference
from spotmorph.local.processes import alive, read_pid

from .test_elastic import BATCH, SEED, SHORT_STEPS

pytestmark = pytest.mark.slow


def test_without_a_cluster_commands_say_how_to_start_one(cluster: LocalCluster) -> None:
    for args in (["local", "add"], ["local", "kill", "node-1"], ["local", "down"]):
        out = cluster.cli(*args, check=False)
        assert out.returncode == 2, args
        assert "spotmorph local up" in out.stderr


# make soak; make test: the replay's schedule in tests/local, down's clean-up in every cluster fixture
@pytest.mark.soak
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

    pids = [read_pid(p) for p in cluster.files.root.rglob("*.pid")]
    assert pids
    cluster.cli("local", "down")
    cluster.wait(lambda: not any(alive(pid) for pid in pids), 30, "every process to end")
    assert not cluster.files.root.exists()
    assert not (cluster.home / "context.json").exists()


# make soak; make test: start failures decided in tests/controller, refused starts in tests/agent/test_refusals.py
@pytest.mark.soak
def test_a_node_that_cannot_start_trainers_says_why_and_the_job_runs_without_it(
    cluster: LocalCluster, tmp_path: Path, references: Path
) -> None:
    cluster.up(nodes=1, slots=2)
    args = cluster.files.vm(1).command()
    broken = cluster.files.vm(9)
    args[args.index("--work-dir") + 1] = str(broken.path)
    broken.path.mkdir(parents=True)  # a VM of its own: vm-1's token proves vm-1, which is one node already
    broken.token_file.write_text(issue_vm_token(cluster.files.state, broken.name))
    args[args.index("--token-file") + 1] = str(broken.token_file)
    args[args.index("--instance-id") + 1] = broken.name
    cluster.start_agent(broken, [*args, "--python", "/nonexistent/bin/python3"])
    cluster.wait(lambda: len(cluster.nodes()) == 2, 60, "the broken node to register")
    checkpoints = tmp_path / "ckpt"
    job = cluster.submit(
        steps=SHORT_STEPS,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=20,
        checkpoint_dir=checkpoints,
    )
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 300)
    assert final["state"] == "SUCCEEDED", final
    events = cluster.event_log()
    assert "TrainerStartFailed" in events
    assert "/nonexistent/bin/python3" in events
    assert final["generation"] >= 2
    assert max_rel_diff(train_reference(references, SHORT_STEPS, BATCH, SEED), checkpoints) <= 1e-9
