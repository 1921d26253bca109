"""A node partitioned from its peers (not from the controller) in the middle of a D = 2 generation.

It beats on, so it is never LOST. Its peers' collectives time out: every node reports CollectiveFailed,
every node is heard from, so the survivors' step is salvaged and the next generation starts on the same
nodes. Its rendezvous is a star around rank 0's node: a node that cannot reach it fails to start.

- ``spoke`` (``make soak``, about two minutes; ``make test`` has the fake-clock tests of the rule and the chaos
  test's partitions): the cut-off node is not rank 0's; it fails to start and is left out
  (TrainerStartFailed), and the job goes on with the free VM;
- ``host`` (``make soak``: two rendezvous timeouts of a minute each): the cut-off node hosts the
  rendezvous; the node that cannot reach it is left out first (one failure cannot say which end is cut
  off), then a second node fails against the same host, which is implicated (NodeImplicated, cause
  ``peer_unreachable``), left out for a while, and the first node is taken back.

The spoke variant takes about two minutes here, over the ~90 s aimed at: the runtime gives a node at
least 60 s to reach the rendezvous host (``worker_agent/runtime/process/trainer.py``, ``_rendezvous``), which this
failure has to wait out. Either way the job finishes equal to the uninterrupted float64 reference
(<= 1e-9) and every generation is explained in the event log.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core.causes import MorphCause
from controller.eventlog.facts import CollectiveFailed, GenerationIssued, NodeImplicated, TrainerStartFailed
from spotmorph.local.harness import LocalCluster, max_rel_diff, train_reference

from .netns_helpers import needs_netns, unexplained

pytestmark = [pytest.mark.slow, needs_netns]
BATCH, SEED, INTERVAL, STEPS = 16, 11, 10, 60


@pytest.mark.parametrize(
    "where", [pytest.param("spoke", marks=pytest.mark.soak), pytest.param("host", marks=pytest.mark.soak)]
)
def test_a_node_cut_off_from_its_peers_is_left_out_and_the_job_ends_equal_to_the_reference(
    cluster: LocalCluster, tmp_path: Path, references: Path, where: str
) -> None:
    cluster.up(nodes=3, slots=1, heartbeat_expiry=3.0, netns=True)
    checkpoints = tmp_path / "ckpt"
    job = cluster.submit(
        steps=STEPS,
        global_batch=BATCH,
        seed=SEED,
        dtype="float64",
        checkpoint_interval=INTERVAL,
        checkpoint_dir=checkpoints,
    )
    status = cluster.wait_step(job, 12, 180)
    placement = [node for node, _ in status["layout"]["detail"]["placement"]]
    assert len(placement) == 2 and status["layout"]["data_parallel"] == 2, status["layout"]
    victim = placement[0] if where == "host" else placement[1]
    cluster.notes.append(f"{victim} ({where}) partitioned from its peers at step {status['step']}")
    cluster.cli("local", "partition", victim, "--from", "peers")
    cluster.wait(lambda: bool(cluster.facts(CollectiveFailed, job)), 60, "the peers' collectives to fail")
    final = cluster.wait_state(job, {"SUCCEEDED", "FAILED"}, 400)
    assert final["state"] == "SUCCEEDED", final
    assert max_rel_diff(train_reference(references, STEPS, BATCH, SEED), checkpoints) <= 1e-9
    issued = cluster.facts(GenerationIssued, job)
    assert not unexplained(final, issued)
    assert cluster.node_state(victim) in {"READY", "ASSIGNED"}, "it beat all along: never LOST"
    causes = [e.fact.morph_cause for e in issued]
    assert MorphCause.COLLECTIVE_FAILED in causes, causes
    if where == "spoke":
        assert [e.node for e in cluster.facts(TrainerStartFailed, job)] == [victim]
        assert causes[-1] == MorphCause.TRAINER_START_FAILED, causes
    else:
        (blamed,) = cluster.facts(NodeImplicated, job)
        assert blamed.node == victim, blamed
        assert causes[-1] == MorphCause.PEER_UNREACHABLE, causes
    cluster.cli("local", "heal", victim)
