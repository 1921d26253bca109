"""A planned morph through memory: the pure decision, and real gloo processes moving held layers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from morphing.layout import make_layout
from morphing.transfer import SourceKind
from spotmorph.local.processes import port_range_base
from worker_agent.contract import CommittedCheckpoint
from worker_agent.runtime.morph.held import Offer, decide

REPO = Path(__file__).resolve().parents[2]
PEER = Path(__file__).with_name("held_peer.py")
NAMED = CommittedCheckpoint(step=5, generation=1)
OLD = make_layout(num_layers=4, pipeline_stages=2, data_parallel=1, micro_batch_size=1, global_batch=6)


def offer(rank: int, step: int = 5, generation: int = 1, job: str = "job") -> Offer:
    first, last = OLD.stage_layers[rank]
    layers = range(first, last)
    return Offer(job, generation, step, OLD.to_dict(), rank, dict.fromkeys(layers, 100))


def test_every_layer_held_gives_a_plan_that_sends_only_what_a_rank_lacks() -> None:
    new = make_layout(num_layers=4, pipeline_stages=1, data_parallel=3, micro_batch_size=1, global_batch=6)
    needs = {r: frozenset(range(4)) for r in range(3)}
    decision = decide([offer(0), offer(1), None], new, needs, NAMED, None)
    assert decision.plan is not None, decision.reason
    sources = decision.plan.sources
    assert sources[(0, 0)].kind is SourceKind.OWN and sources[(0, 2)].kind is SourceKind.PEER
    assert all(sources[(2, layer)].kind is SourceKind.PEER for layer in range(4))
    assert not decision.plan.from_disk()


@pytest.mark.parametrize(
    ("offers", "why"),
    [
        ([None, None, None], "no trainer holds step 5"),
        ([offer(0, step=4), offer(1, step=4), None], "no trainer holds step 5"),
        ([offer(0, generation=2), offer(1), None], "layers 0, 1 are held by no trainer"),
        ([offer(0), offer(1, job="other"), None], "disagree"),
        ([offer(0), offer(0), None], "two trainers claim the same old rank"),
        ([offer(0), None, None], "layers 2, 3 are held by no trainer and step 5 has no durable checkpoint"),
    ],
)
def test_memory_is_left_for_the_disk_with_the_reason(offers: list[Offer | None], why: str) -> None:
    new = make_layout(num_layers=4, pipeline_stages=1, data_parallel=3, micro_batch_size=1, global_batch=6)
    decision = decide(offers, new, {r: frozenset(range(4)) for r in range(3)}, NAMED, None)
    assert decision.plan is None and why in decision.reason


def test_layers_no_one_holds_come_from_the_disk_when_the_held_step_is_the_committed_one() -> None:
    new = make_layout(num_layers=4, pipeline_stages=1, data_parallel=2, micro_batch_size=1, global_batch=6)
    decision = decide([offer(0), None], new, {r: frozenset(range(4)) for r in range(2)}, NAMED, NAMED)
    assert decision.plan is not None and decision.plan.from_disk() == frozenset({2, 3})


def run_world(tmp_path: Path, scenario: str, world: int = 3) -> list[dict[str, Any]]:
    port = port_range_base(1)  # below the ephemeral range: no outgoing connection takes it before the store does
    outs = [tmp_path / f"rank-{r}.json" for r in range(world)]
    procs = [
        subprocess.Popen([sys.executable, str(PEER), str(r), str(world), str(port), scenario, str(outs[r])], cwd=REPO)
        for r in range(world)
    ]
    for proc in procs:
        proc.wait(timeout=120)
    return [json.loads(out.read_text()) if out.exists() else {} for out in outs]


@pytest.mark.slow
def test_held_layers_move_to_the_ranks_that_lack_them_bit_for_bit(tmp_path: Path) -> None:
    results = run_world(tmp_path, "move")
    assert all(r.get("used") and r.get("same") and r["told"] == [] for r in results), results
    assert results[0]["received"] > 0 and results[2]["received"] > results[0]["received"]


@pytest.mark.slow
def test_a_checksum_mismatch_leaves_memory_on_every_rank(tmp_path: Path) -> None:
    results = run_world(tmp_path, "corrupt")
    assert all(r.get("used") is False for r in results), results
    assert any("checksum (XXH3-128)" in r["reason"] for r in results), results
    assert all(r["told"] == [["checksum_mismatch", r["reason"]]] for r in results), "each rank says why, and its class"


@pytest.mark.slow
def test_a_sender_killed_mid_transfer_fails_the_exchange_on_its_receivers(tmp_path: Path) -> None:
    results = run_world(tmp_path, "die")
    assert results[1] == {}, "rank 1 was killed after its first tensor was on its way"
    survivors = [results[0], results[2]]
    assert all(r.get("raised", "").startswith("ExchangeFailed(") for r in survivors), results
    for r in survivors:  # not a skip: the generation ends, and its processes hold the step again for the next
        assert r["told"] == [] and r["cause"] == "peer_lost", r
        assert "the exchange of step 5 held by generation 1 lost a peer: " in r["raised"], r


@pytest.mark.slow
def test_a_silent_sender_fails_the_exchange_after_the_peer_timeout_not_the_world_groups(tmp_path: Path) -> None:
    """Rank 1 stays alive and sends nothing. Its receivers give up on the exchange group's peer timeout (2 s)
    with a timeout; on the world group's (30 s) they would still wait when rank 1 exits, and see it close."""
    results = run_world(tmp_path, "silent")
    for r in (results[0], results[2]):
        assert r.get("raised", "").startswith("ExchangeFailed(") and "Timed out" in r["raised"], results
        assert r["told"] == [] and r["cause"] == "peer_timeout", r


@pytest.mark.slow
def test_a_leaving_rank_hands_the_stage_only_it_holds_to_a_staying_one_bit_for_bit(tmp_path: Path) -> None:
    stays, leaves = run_world(tmp_path, "handoff", world=2)
    assert stays["ok"] and leaves["ok"], (stays, leaves)
    assert stays["layers"] == [0, 1, 2, 3] and stays["same"]  # its own stage, and the leaver's, exactly
    assert leaves["sent"] > 0 and stays["received"] == leaves["sent"]  # the tensors' bytes, as they lie
    new = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=1, global_batch=6)
    held = Offer("job", 1, 5, OLD.to_dict(), 0, dict.fromkeys(stays["layers"], 100))
    decision = decide([held], new, {0: frozenset(range(4))}, NAMED, None)  # the next generation needs no disk
    assert decision.plan is not None and all(s.kind is SourceKind.OWN for s in decision.plan.sources.values())


@pytest.mark.slow
def test_a_hand_off_with_a_bad_checksum_fails_on_every_rank(tmp_path: Path) -> None:
    results = run_world(tmp_path, "handoff-corrupt", world=2)
    assert all(r.get("ok") is False for r in results), results
    assert any("checksum (XXH3-128)" in r["reason"] for r in results), results
