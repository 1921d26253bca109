"""Playing a chaos schedule against a running local cluster, through the ``spotmorph local`` verbs.

A pick in the schedule becomes a node name only when its fault is due: the candidates are the nodes
the controller lists as READY or ASSIGNED that this run has not cut off, killed or preempted, in name
order. Every fault applied is recorded with the node it hit, so a report can say what happened, and
a run ends with every partition healed, whatever went wrong in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from spotmorph.local.chaos import Fault, Verb
from spotmorph.local.harness import LocalCluster

SERVING = frozenset({"READY", "ASSIGNED"})


@dataclass(frozen=True)
class Applied:
    """A fault as it was applied: on which node, when (seconds after the start), and what came of it."""

    fault: Fault
    node: str | None
    at: float
    outcome: str  # "done", or why the fault was skipped

    def describe(self) -> str:
        return f"t+{self.at:.1f}s {self.fault.verb} {self.node or '-'}: {self.outcome} ({self.fault.describe()})"


@dataclass(frozen=True)
class ChaosResult:
    """What a run did: the faults applied, in order."""

    applied: tuple[Applied, ...]

    def count(self, verb: Verb) -> int:
        return sum(1 for a in self.applied if a.fault.verb is verb and a.outcome.startswith("done"))

    def unnoticed_losses(self) -> int:
        """Faults that take a node away without an eviction notice: kills and partitions."""
        return self.count(Verb.KILL) + self.count(Verb.PARTITION)

    def describe(self) -> str:
        return "\n".join(a.describe() for a in self.applied) or "(no fault applied)"


class ChaosRun:
    """Applies ``faults`` to ``cluster`` on time until they run out or ``stop()`` says so."""

    def __init__(self, cluster: LocalCluster, faults: tuple[Fault, ...], say: Callable[[str], None] = print) -> None:
        self.cluster = cluster
        self.faults = faults
        self.say = say
        self.out_of_service: set[str] = set()  # killed, preempted or cut off by this run
        self.partitioned: list[str | None] = []  # node of partition number i (None: it was skipped)
        self.applied: list[Applied] = []

    def run(self, stop: Callable[[], bool]) -> ChaosResult:
        start = time.monotonic()
        try:
            for fault in self.faults:
                while (remaining := fault.at - (time.monotonic() - start)) > 0:
                    if stop():
                        return self.result()
                    time.sleep(min(0.5, remaining))
                if stop() and fault.verb is not Verb.HEAL:
                    continue
                self.applied.append(self._apply(fault, time.monotonic() - start))
                self.say(self.applied[-1].describe())
        finally:
            self.heal_all(start)
        return self.result()

    def result(self) -> ChaosResult:
        return ChaosResult(tuple(self.applied))

    def heal_all(self, start: float) -> None:
        """Heal every partition still in place (also when the run stops early or fails)."""
        healed = {a.node for a in self.applied if a.fault.verb is Verb.HEAL and a.outcome == "done"}
        for node in self.partitioned:
            if node is not None and node not in healed:
                self.cluster.cli("local", "heal", node, check=False)
                self.out_of_service.discard(node)
                self.applied.append(Applied(Fault(0.0, Verb.HEAL), node, time.monotonic() - start, "done"))

    def candidates(self) -> list[str]:
        serving = (n["name"] for n in self.cluster.nodes() if n["state"] in SERVING)
        return sorted((name for name in serving if name not in self.out_of_service), key=lambda n: (len(n), n))

    def _apply(self, fault: Fault, at: float) -> Applied:
        if fault.verb is Verb.ADD:
            self.cluster.add(1)
            return Applied(fault, None, at, "done")
        if fault.verb is Verb.HEAL:
            node = self.partitioned[fault.pick] if fault.pick < len(self.partitioned) else None
            if node is None:
                return Applied(fault, None, at, "skipped: its partition was not made")
            out = self.cluster.cli("local", "heal", node, check=False)
            self.out_of_service.discard(node)
            return Applied(fault, node, at, "done" if out.returncode == 0 else f"failed: {out.stderr.strip()}")
        nodes = self.candidates()
        if not nodes:
            if fault.verb is Verb.PARTITION:
                self.partitioned.append(None)
            return Applied(fault, None, at, "skipped: no serving node")
        node = nodes[fault.pick % len(nodes)]
        args = self._arguments(fault, node)
        out = self.cluster.cli("local", *args, check=False)
        slowed = ""
        if fault.verb is Verb.NETEM and out.returncode == 2 and "sch_netem" in out.stderr:
            # No netem in this kernel: the link is still slowed, by a rate limit alone (tbf).
            out = self.cluster.cli("local", "netem", node, "--rate", str(fault.rate_mbit), check=False)
            slowed = " (rate only: this kernel has no sch_netem for --delay/--loss)"
        done = out.returncode == 0
        if fault.verb is Verb.PARTITION:
            self.partitioned.append(node if done else None)
        if done and fault.verb in (Verb.KILL, Verb.PREEMPT, Verb.PARTITION):
            self.out_of_service.add(node)
        reason = (out.stderr or out.stdout).strip().splitlines()
        outcome = f"done{slowed}" if done else f"skipped (exit {out.returncode}): {' '.join(reason)}"
        return Applied(fault, node, at, outcome)

    @staticmethod
    def _arguments(fault: Fault, node: str) -> list[str]:
        if fault.verb is Verb.PREEMPT:
            return ["preempt", node, "--notice", str(fault.notice)]
        if fault.verb is Verb.KILL:
            return ["kill", node]
        if fault.verb is Verb.PARTITION:
            return ["partition", node, "--from", str(fault.cut)]
        return [
            *("netem", node, "--delay", str(fault.delay_ms), "--loss", str(fault.loss_pct)),
            *("--rate", str(fault.rate_mbit)),
        ]
