"""A seeded schedule of faults for chaos tests: which verb, when, and on which kind of node.

The schedule is a pure function of a seed and the options, so a failing chaos run is replayed by its
seed. It keeps its own model of the cluster (how many nodes are healthy, which are cut off) so that it
never takes the cluster below ``min_healthy`` nodes, and it heals every partition it makes. It names
nodes by position (``pick``) rather than by name, because names are given by the controller when a
node registers: the runner resolves a pick against the nodes it sees at that moment and logs the name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum


class Verb(StrEnum):
    """The ``spotmorph local`` fault verbs a schedule uses."""

    PREEMPT = "preempt"  # eviction with notice
    KILL = "kill"  # gone without notice
    PARTITION = "partition"
    HEAL = "heal"
    NETEM = "netem"
    ADD = "add"


class Cut(StrEnum):
    """What a partition cuts a node off from (``spotmorph local partition NODE --from``)."""

    CONTROLLER = "controller"
    PEERS = "peers"
    ALL = "all"


# Verbs that take a healthy node out of service, for good (preempt, kill) or for a while (partition).
DISRUPTIVE = frozenset({Verb.PREEMPT, Verb.KILL, Verb.PARTITION})


@dataclass(frozen=True)
class Fault:
    """One fault: ``verb`` at ``at`` seconds after the start, on candidate ``pick`` (modulo their count).

    Candidates are the healthy nodes in name order for every verb but ``heal``, whose candidate is the
    node of partition number ``pick`` (counted from 0 in schedule order).
    """

    at: float
    verb: Verb
    pick: int = 0
    cut: Cut | None = None
    notice: float | None = None
    delay_ms: int | None = None
    loss_pct: float | None = None
    rate_mbit: int | None = None

    def describe(self) -> str:
        extra = {
            "from": self.cut,
            "notice": self.notice,
            "delay_ms": self.delay_ms,
            "loss_pct": self.loss_pct,
            "rate_mbit": self.rate_mbit,
        }
        options = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
        return f"t+{self.at:.1f}s {self.verb} pick={self.pick} {options}".rstrip()


@dataclass(frozen=True)
class ChaosOptions:
    """How much chaos: the cluster's start size, the floor it never goes below, the faults' pace."""

    nodes: int
    faults: int = 8
    min_healthy: int = 2
    max_nodes: int = 8
    verbs: frozenset[Verb] = frozenset(Verb) - {Verb.HEAL}
    gap_seconds: tuple[float, float] = (4.0, 9.0)
    partition_seconds: tuple[float, float] = (3.0, 10.0)
    notice_seconds: tuple[float, float] = (6.0, 15.0)
    delay_ms: tuple[int, int] = (5, 60)
    loss_pct: tuple[float, float] = (0.0, 5.0)
    rate_mbit: tuple[int, int] = (20, 200)

    def __post_init__(self) -> None:
        if self.nodes < self.min_healthy or self.min_healthy < 1:
            raise ValueError(f"nodes={self.nodes}, min_healthy={self.min_healthy}: need nodes >= min_healthy >= 1")
        if self.max_nodes < self.nodes:
            raise ValueError(f"max_nodes={self.max_nodes} < nodes={self.nodes}")
        if Verb.HEAL in self.verbs:
            raise ValueError("heal is scheduled by the partitions themselves; leave it out of verbs")
        for name in ("gap_seconds", "partition_seconds", "notice_seconds", "delay_ms", "loss_pct", "rate_mbit"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name}={(low, high)}: need 0 <= low <= high")


@dataclass
class _Model:
    """What the schedule believes about the cluster while it draws faults."""

    healthy: int
    total: int
    partitions: list[float] = field(default_factory=list)  # heal time of each partition, in order

    def cut_off(self, now: float) -> int:
        return sum(1 for heal_at in self.partitions if heal_at > now)


def plan_chaos(seed: int, options: ChaosOptions) -> tuple[Fault, ...]:
    """``options.faults`` faults (plus one heal per partition), in time order; the same for the same seed."""
    rng = random.Random(seed)
    model = _Model(healthy=options.nodes, total=options.nodes)
    faults: list[Fault] = []
    now = 0.0
    for _ in range(options.faults):
        now += rng.uniform(*options.gap_seconds)
        # Nodes cut off earlier and healed by now are healthy again.
        usable = model.healthy - model.cut_off(now)
        choices = sorted(_feasible(options, model, usable), key=str)
        if not choices:
            continue
        verb = rng.choice(choices)
        pick = rng.randrange(max(usable, 1))
        if verb is Verb.ADD:
            model.healthy += 1
            model.total += 1
            faults.append(Fault(now, verb))
        elif verb is Verb.PREEMPT:
            model.healthy -= 1
            faults.append(Fault(now, verb, pick, notice=round(rng.uniform(*options.notice_seconds), 1)))
        elif verb is Verb.KILL:
            model.healthy -= 1
            faults.append(Fault(now, verb, pick))
        elif verb is Verb.PARTITION:
            heal_at = now + rng.uniform(*options.partition_seconds)
            faults.append(Fault(now, verb, pick, cut=rng.choice(sorted(Cut, key=str))))
            faults.append(Fault(heal_at, Verb.HEAL, len(model.partitions)))
            model.partitions.append(heal_at)
        else:
            delay = rng.randint(*options.delay_ms)
            loss = round(rng.uniform(*options.loss_pct), 1)
            rate = rng.randint(*options.rate_mbit)
            faults.append(Fault(now, verb, pick, delay_ms=delay, loss_pct=loss, rate_mbit=rate))
    return tuple(sorted(faults, key=lambda f: f.at))


def _feasible(options: ChaosOptions, model: _Model, usable: int) -> set[Verb]:
    verbs = set(options.verbs)
    if usable <= options.min_healthy:
        verbs -= DISRUPTIVE
    if model.total >= options.max_nodes:
        verbs.discard(Verb.ADD)
    if usable < 1:
        verbs.discard(Verb.NETEM)
    return verbs
