"""The chaos schedule: deterministic per seed, never below the healthy floor, every partition healed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotmorph.local.chaos import DISRUPTIVE, ChaosOptions, Cut, Fault, Verb, plan_chaos

options_strategy = st.builds(
    lambda nodes, extra, floor, faults, verbs: ChaosOptions(
        nodes=nodes, max_nodes=nodes + extra, min_healthy=min(floor, nodes), faults=faults, verbs=frozenset(verbs)
    ),
    nodes=st.integers(1, 8),
    extra=st.integers(0, 4),
    floor=st.integers(1, 4),
    faults=st.integers(0, 30),
    verbs=st.sets(st.sampled_from(sorted(set(Verb) - {Verb.HEAL}, key=str)), min_size=1),
)


def replay_model(options: ChaosOptions, faults: tuple[Fault, ...]) -> list[int]:
    """Usable nodes (healthy, not cut off) right after each fault, by replaying the schedule."""
    healthy = options.nodes
    cut = 0
    usable_after = []
    for fault in faults:
        if fault.verb in (Verb.PREEMPT, Verb.KILL):
            healthy -= 1
        elif fault.verb is Verb.ADD:
            healthy += 1
        elif fault.verb is Verb.PARTITION:
            cut += 1
        elif fault.verb is Verb.HEAL:
            cut -= 1
        usable_after.append(healthy - cut)
    return usable_after


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), options=options_strategy)
def test_schedule_keeps_its_promises(seed: int, options: ChaosOptions) -> None:
    faults = plan_chaos(seed, options)
    assert faults == plan_chaos(seed, options)
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    assert sum(1 for f in faults if f.verb is not Verb.HEAL) <= options.faults
    assert all(f.verb is Verb.HEAL or f.verb in options.verbs for f in faults)
    partitions = [f for f in faults if f.verb is Verb.PARTITION]
    heals = [f for f in faults if f.verb is Verb.HEAL]
    assert len(heals) == len(partitions)
    assert sorted(h.pick for h in heals) == list(range(len(partitions)))
    for heal in heals:
        assert heal.at >= sorted(partitions, key=lambda f: f.at)[heal.pick].at
    assert all(p.cut in set(Cut) for p in partitions)
    # A disruptive fault is only drawn when more than the floor is usable, so the floor holds after it.
    usable = replay_model(options, faults)
    for fault, after in zip(faults, usable, strict=True):
        if fault.verb in DISRUPTIVE:
            assert after >= options.min_healthy, (fault, after)
    added = sum(1 for f in faults if f.verb is Verb.ADD)
    assert options.nodes + added <= options.max_nodes
    assert all(f.notice is not None for f in faults if f.verb is Verb.PREEMPT)
    assert all(None not in (f.delay_ms, f.loss_pct, f.rate_mbit) for f in faults if f.verb is Verb.NETEM)


def test_a_long_schedule_uses_every_verb_and_every_cut() -> None:
    faults = plan_chaos(11, ChaosOptions(nodes=6, faults=60, max_nodes=12))
    assert {f.verb for f in faults} == set(Verb)
    assert {f.cut for f in faults if f.verb is Verb.PARTITION} == set(Cut)
    assert plan_chaos(12, ChaosOptions(nodes=6, faults=60, max_nodes=12)) != faults


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"nodes": 1, "min_healthy": 2}, "nodes >= min_healthy"),
        ({"nodes": 4, "max_nodes": 3}, "max_nodes=3"),
        ({"nodes": 4, "verbs": frozenset({Verb.HEAL})}, "heal is scheduled"),
        ({"nodes": 4, "gap_seconds": (5.0, 1.0)}, "gap_seconds"),
    ],
)
def test_impossible_options_are_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ChaosOptions(**kwargs)  # type: ignore[arg-type]
