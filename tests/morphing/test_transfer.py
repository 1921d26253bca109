"""The transfer plan: every layer a new rank needs comes from exactly one place, the best one available."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphing.layout import Layout, make_layout
from morphing.transfer import (
    Source,
    SourceKind,
    Transfer,
    TransferPlan,
    plan_handoff,
    plan_transfer,
    stage_range,
)

OWN = Source(SourceKind.OWN)
DISK = Source(SourceKind.DISK)


def peer(sender: int) -> Source:
    return Source(SourceKind.PEER, sender)


def layout(layers: int, stages: int, replicas: int, stage_layers: tuple[tuple[int, int], ...] | None = None) -> Layout:
    return make_layout(
        num_layers=layers,
        pipeline_stages=stages,
        data_parallel=replicas,
        micro_batch_size=1,
        global_batch=replicas,
        stage_layers=stage_layers,
    )


@st.composite
def layouts(draw: st.DrawFn, layers: int) -> Layout:
    """A valid layout of ``layers`` layers with a random contiguous partition (not only the even one)."""
    stages = draw(st.integers(1, min(layers, 4)))
    cuts: list[int] = []
    if stages > 1:
        cuts = sorted(draw(st.sets(st.integers(1, layers - 1), min_size=stages - 1, max_size=stages - 1)))
    bounds = [0, *cuts, layers]
    ranges = tuple((bounds[i], bounds[i + 1]) for i in range(stages))
    return layout(layers, stages, draw(st.integers(1, 4)), ranges)


@dataclass(frozen=True)
class Move:
    old: Layout
    new: Layout
    survivors: dict[int, int]
    layer_bytes: tuple[int, ...]


@st.composite
def moves(draw: st.DrawFn, equal_sizes: bool = False) -> Move:
    layers = draw(st.integers(1, 12))
    old = draw(layouts(layers))
    new = draw(layouts(layers))
    kept = sorted(draw(st.sets(st.integers(0, old.world_size - 1), max_size=min(old.world_size, new.world_size))))
    targets = draw(st.permutations(range(new.world_size)))
    survivors = dict(zip(kept, targets, strict=False))
    if equal_sizes:
        layer_bytes = (draw(st.integers(1, 1000)),) * layers
    else:
        layer_bytes = tuple(draw(st.lists(st.integers(0, 10**9), min_size=layers, max_size=layers)))
    return Move(old, new, survivors, layer_bytes)


def plan_of(move: Move) -> TransferPlan:
    return plan_transfer(move.old, move.new, move.survivors, move.layer_bytes)


def holds(move: Move, new_rank: int, layer: int) -> bool:
    """Whether the process that becomes ``new_rank`` held ``layer`` in its old stage."""
    return any(n == new_rank and layer in stage_range(move.old, o) for o, n in move.survivors.items())


def survived(move: Move, layer: int) -> bool:
    return any(layer in stage_range(move.old, o) for o in move.survivors)


@settings(max_examples=300, deadline=None)
@given(moves())
def test_every_needed_layer_has_exactly_one_source_and_it_is_the_right_kind(move: Move) -> None:
    plan = plan_of(move)
    needed = {(r, layer) for r in range(move.new.world_size) for layer in stage_range(move.new, r)}
    assert set(plan.sources) == needed
    senders = set(move.survivors.values())
    for (rank, layer), source in plan.sources.items():
        if holds(move, rank, layer):
            assert source == OWN, "a rank that holds a layer keeps it and never receives it"
        elif source.kind is SourceKind.PEER:
            assert source.sender in senders and source.sender != rank
            assert holds(move, source.sender, layer), "a sender must have held the layer"
        else:
            assert source == DISK
            assert not survived(move, layer), "disk only when no survivor held the layer"
    assert plan.from_disk() == {layer for (_, layer), s in plan.sources.items() if s.kind is SourceKind.DISK}


@settings(max_examples=200, deadline=None)
@given(moves())
def test_transfers_are_the_peer_sources_in_one_order_and_bytes_add_up(move: Move) -> None:
    plan = plan_of(move)
    transfers = plan.transfers()
    assert list(transfers) == sorted(transfers, key=lambda t: (t.layer, t.sender, t.receiver))
    assert {(t.receiver, t.layer): peer(t.sender) for t in transfers} == {
        key: s for key, s in plan.sources.items() if s.kind is SourceKind.PEER
    }
    assert len({(t.receiver, t.layer) for t in transfers}) == len(transfers), "each layer received once"
    assert all(t.nbytes == move.layer_bytes[t.layer] for t in transfers)
    sent: dict[int, int] = {}
    for t in transfers:
        sent[t.sender] = sent.get(t.sender, 0) + t.nbytes
    assert plan.bytes_sent() == sent


@settings(max_examples=200, deadline=None)
@given(moves())
def test_the_plan_is_a_pure_function_of_the_inputs(move: Move) -> None:
    plan = plan_of(move)
    reordered = dict(reversed(list(move.survivors.items())))
    again = plan_transfer(move.old, move.new, reordered, list(move.layer_bytes))
    assert again == plan
    assert again.transfers() == plan.transfers()
    assert list(again.sources) == list(plan.sources)


@settings(max_examples=200, deadline=None)
@given(moves())
def test_dropped_is_what_a_survivor_held_and_no_longer_needs(move: Move) -> None:
    plan = plan_of(move)
    dropped = plan.dropped()
    for old_rank, new_rank in move.survivors.items():
        held = set(stage_range(move.old, old_rank))
        expected = held - set(stage_range(move.new, new_rank))
        assert dropped.get(new_rank, frozenset()) == expected
        assert all(plan.sources[(new_rank, layer)] == OWN for layer in held - expected)
    assert all(layers for layers in dropped.values())


def groups(move: Move) -> dict[int, list[int]]:
    """Old stage -> the new ranks of its survivors: the holders of each of its layers (disjoint groups)."""
    found: dict[int, list[int]] = {}
    for old_rank, new_rank in move.survivors.items():
        found.setdefault(move.old.coords(old_rank)[1], []).append(new_rank)
    return found


@settings(max_examples=300, deadline=None)
@given(moves(equal_sizes=True))
def test_equal_layers_spread_evenly_over_their_holders(move: Move) -> None:
    """D holders of equally sized layers send within one layer of each other: max = ceil(sent / D) layers."""
    plan = plan_of(move)
    size = move.layer_bytes[0]
    sent = plan.bytes_sent()
    for stage, ranks in groups(move).items():
        first, last = move.old.stage_layers[stage]
        total = sum(t.nbytes for t in plan.transfers() if first <= t.layer < last)
        loads = [sent.get(r, 0) for r in ranks]
        assert max(loads) - min(loads) <= size
        assert max(loads) == math.ceil(total / size / len(ranks)) * size


@settings(max_examples=300, deadline=None)
@given(moves())
def test_no_sender_sends_more_than_its_share_plus_one_layer(move: Move) -> None:
    """The greedy's guarantee: a holder's load is at most the group's average plus its largest layer."""
    plan = plan_of(move)
    sent = plan.bytes_sent()
    for stage, ranks in groups(move).items():
        first, last = move.old.stage_layers[stage]
        group = [t for t in plan.transfers() if first <= t.layer < last]
        if not group:
            continue
        total = sum(t.nbytes for t in group)
        largest = max(t.nbytes for t in group)
        assert all(len(ranks) * sent.get(r, 0) <= total + len(ranks) * largest for r in ranks)


@given(layouts(8))
def test_everyone_surviving_in_the_same_layout_keeps_everything(same: Layout) -> None:
    plan = plan_transfer(same, same, {r: r for r in range(same.world_size)}, [1] * 8)
    assert all(s == OWN for s in plan.sources.values())
    assert plan.transfers() == () and plan.from_disk() == frozenset() and plan.dropped() == {}


def test_two_by_two_to_three_stages_with_one_rank_gone() -> None:
    old = layout(4, 2, 2)  # ranks 0, 2 hold layers 0-1; ranks 1, 3 hold layers 2-3
    new = layout(4, 3, 1)  # stages [0, 2), [2, 3), [3, 4)
    plan = plan_transfer(old, new, {0: 0, 1: 1, 2: 2}, [10, 20, 30, 40])
    assert dict(plan.sources) == {(0, 0): OWN, (0, 1): OWN, (1, 2): OWN, (2, 3): peer(1)}
    assert plan.transfers() == (Transfer(layer=3, sender=1, receiver=2, nbytes=40),)
    assert plan.bytes_sent() == {1: 40}
    assert plan.from_disk() == frozenset()
    assert plan.dropped() == {1: frozenset({3}), 2: frozenset({0, 1})}


def test_two_by_two_to_three_replicas_balances_the_senders() -> None:
    old = layout(4, 2, 2)
    new = layout(4, 1, 3)  # every new rank needs all four layers
    plan = plan_transfer(old, new, {0: 0, 1: 1, 2: 2}, [10, 20, 30, 40])
    # Layers 2-3 have one holder (new 1); layers 0-1 two (new 0 and 2): the larger goes first, to new 0,
    # then the smaller to new 2, which has sent less.
    assert plan.sources[(1, 1)] == peer(0) and plan.sources[(1, 0)] == peer(2)
    assert plan.transfers() == (
        Transfer(0, 2, 1, 10),
        Transfer(1, 0, 1, 20),
        Transfer(2, 1, 0, 30),
        Transfer(2, 1, 2, 30),
        Transfer(3, 1, 0, 40),
        Transfer(3, 1, 2, 40),
    )
    assert plan.bytes_sent() == {0: 20, 1: 140, 2: 10}


def test_adding_a_node_three_stages_to_two_by_two() -> None:
    old = layout(6, 3, 1)  # [0, 2), [2, 4), [4, 6)
    new = layout(6, 2, 2)  # ranks 0, 2: [0, 3); ranks 1, 3: [3, 6)
    plan = plan_transfer(old, new, {0: 0, 1: 1, 2: 2}, [1] * 6)
    assert [plan.sources[(0, layer)] for layer in range(3)] == [OWN, OWN, peer(1)]
    assert [plan.sources[(1, layer)] for layer in range(3, 6)] == [OWN, peer(2), peer(2)]
    assert [plan.sources[(2, layer)] for layer in range(3)] == [peer(0), peer(0), peer(1)]
    assert [plan.sources[(3, layer)] for layer in range(3, 6)] == [peer(1), peer(2), peer(2)]
    assert plan.bytes_sent() == {0: 2, 1: 3, 2: 4}
    assert plan.from_disk() == frozenset()


def test_adding_a_replica_spreads_the_newcomer_over_all_holders() -> None:
    old = layout(6, 1, 3)
    new = layout(6, 1, 4)
    plan = plan_transfer(old, new, {0: 0, 1: 1, 2: 2}, [5] * 6)
    assert {plan.sources[(3, layer)] for layer in range(6)} == {peer(0), peer(1), peer(2)}
    assert plan.bytes_sent() == {0: 10, 1: 10, 2: 10}
    assert all(plan.sources[(r, layer)] == OWN for r in range(3) for layer in range(6))


def test_everything_gone_reads_everything_from_disk() -> None:
    old, new = layout(5, 2, 2), layout(5, 1, 2)
    plan = plan_transfer(old, new, {}, [1] * 5)
    assert all(s == DISK for s in plan.sources.values()) and len(plan.sources) == 10
    assert plan.from_disk() == frozenset(range(5))
    assert plan.transfers() == () and plan.bytes_sent() == {} and plan.dropped() == {}


def test_a_lost_stage_comes_from_disk_while_the_rest_moves_over_the_network() -> None:
    old, new = layout(4, 2, 1), layout(4, 1, 2)
    plan = plan_transfer(old, new, {0: 1}, [1] * 4)  # old rank 1 (layers 2-3) is gone
    assert [plan.sources[(0, layer)] for layer in range(4)] == [peer(1), peer(1), DISK, DISK]
    assert [plan.sources[(1, layer)] for layer in range(4)] == [OWN, OWN, DISK, DISK]
    assert plan.from_disk() == frozenset({2, 3})


@pytest.mark.parametrize(
    ("new_layers", "layer_bytes", "survivors", "message"),
    [
        (5, [1] * 4, {}, r"old layout has 4 layers but the new one has 5"),
        (4, [1] * 3, {}, r"layer_bytes has 3 sizes for 4 layers"),
        (4, [1, -1, 1, 1], {}, r"negative for layers \[1\]"),
        (4, [1] * 4, {4: 0}, r"old rank 4 is outside"),
        (4, [1] * 4, {-1: 0}, r"old rank -1 is outside"),
        (4, [1] * 4, {0: 2}, r"maps to new rank 2, outside"),
        (4, [1] * 4, {0: 1, 3: 1}, r"two old ranks map to one new rank: \{1: \[0, 3\]\}"),
    ],
)
def test_inconsistent_inputs_are_refused_with_the_reason(
    new_layers: int, layer_bytes: list[int], survivors: dict[int, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_transfer(layout(4, 2, 2), layout(new_layers, 2, 1), survivors, layer_bytes)


def test_a_source_has_a_sender_exactly_when_it_is_a_peer() -> None:
    with pytest.raises(ValueError, match="only a peer source"):
        Source(SourceKind.PEER)
    with pytest.raises(ValueError, match="only a peer source"):
        Source(SourceKind.DISK, 3)


def test_a_stage_with_a_tied_copy_also_receives_the_layer_of_record() -> None:
    old = layout(4, 2, 1)  # stage 0: layers 0-1 (the embedding, layer 0), stage 1: layers 2-3 (a tied head)
    new = layout(4, 2, 1)
    needs = {0: frozenset({0, 1}), 1: frozenset({0, 2, 3})}  # the head's stage needs the embedding's state too
    plan = plan_transfer(old, new, {0: 0, 1: 1}, [10, 10, 10, 10], needs=needs)
    assert plan.sources[(1, 0)] == Source(SourceKind.PEER, 0)
    assert plan.sources[(1, 2)].kind is SourceKind.OWN and (1, 1) not in plan.sources
    with pytest.raises(ValueError, match="needs layer 9"):
        plan_transfer(old, new, {0: 0}, [10, 10, 10, 10], needs={0: frozenset({9})})


@st.composite
def stops(draw: st.DrawFn) -> tuple[Layout, frozenset[int], tuple[int, ...]]:
    layers = draw(st.integers(1, 12))
    old = draw(layouts(layers))
    leaving = frozenset(draw(st.sets(st.integers(0, old.world_size - 1))))
    sizes = tuple(draw(st.lists(st.integers(0, 10**9), min_size=layers, max_size=layers)))
    return old, leaving, sizes


@settings(max_examples=300, deadline=None)
@given(stops())
def test_a_handoff_leaves_every_layer_with_a_staying_rank_and_moves_only_orphans(
    case: tuple[Layout, frozenset[int], tuple[int, ...]],
) -> None:
    old, leaving, sizes = case
    moves_ = plan_handoff(old, leaving, sizes)
    staying = [r for r in range(old.world_size) if r not in leaving]
    if not staying or not leaving:
        assert moves_ == ()
        return
    for move in moves_:
        assert move.sender in leaving and move.receiver not in leaving  # only leavers send, only stayers take
        assert move.layer in stage_range(old, move.sender)  # a sender sends what it holds
        assert move.nbytes == sizes[move.layer]
    sent = [move.layer for move in moves_]
    assert len(sent) == len(set(sent))  # each orphan once
    kept_by_stayers = {layer for r in staying for layer in stage_range(old, r)}
    assert kept_by_stayers.isdisjoint(sent)  # a layer a stayer holds is never sent
    assert kept_by_stayers | set(sent) == set(range(old.num_layers))  # after it, every layer stays
    assert list(moves_) == sorted(moves_)


def test_a_leaving_pipeline_stage_is_spread_over_the_stayers_by_bytes() -> None:
    old = layout(4, 2, 2)  # ranks 0,2: stage 0 (layers 0-1); ranks 1,3: stage 1 (layers 2-3)
    moves_ = plan_handoff(old, frozenset({1, 3}), (5, 5, 10, 7))
    # Stage 1 leaves whole: layer 2 (10 bytes) first, from rank 1 to rank 0; layer 3 from rank 3 to rank 2.
    assert moves_ == (Transfer(2, 1, 0, 10), Transfer(3, 3, 2, 7))
    assert plan_handoff(old, frozenset({3}), (5, 5, 10, 7)) == ()  # rank 1 still holds stage 1
    assert plan_handoff(old, frozenset({0, 1, 2, 3}), (5, 5, 10, 7)) == ()  # nobody to take it: the stop writes


def test_a_survivor_holding_handed_layers_keeps_them_in_the_next_plan() -> None:
    old = layout(4, 2, 1)  # rank 0: layers 0-1, rank 1: layers 2-3; rank 1 leaves, rank 0 took layers 2-3
    new = layout(4, 1, 1)
    plan = plan_transfer(old, new, {0: 0}, (1, 1, 1, 1), holds={0: frozenset(range(4))})
    assert all(plan.sources[(0, layer)] == OWN for layer in range(4))
    assert plan.from_disk() == frozenset()
    with pytest.raises(ValueError, match="outside the model"):
        plan_transfer(old, new, {0: 0}, (1, 1, 1, 1), holds={0: frozenset({9})})
    with pytest.raises(ValueError, match="leaving ranks"):
        plan_handoff(old, frozenset({5}), (1, 1, 1, 1))
