"""Nodes their peers cannot reach: a node partitioned from the other VMs but not from the controller.

Such a node beats on, so it is never LOST, yet every generation that includes it fails: its peers'
collectives time out (every node is heard from, so that counts as a restart), and the next generation
cannot even start. The evidence is that start. A generation's rendezvous is a star around rank 0's node,
the host of its store, which waits for the others longer than they try to reach it (the runtime's
``_rendezvous``), so the nodes whose trainers could not start while the host waited each say "I cannot
reach the host": an **edge** (node, host), kept on the job with its time.

One edge cannot say which end is cut off; the rule before this one leaves the node that could not start
out of the job (``exclusions.nodes``). A node in edges with **two or more different partners** within
``unreachable_memory_seconds`` is the one thing those failures have in common: it is **implicated**. It
is left out of the job's generations for ``unreachable_exclusion_seconds`` (``exclusions.until``; a
``NodeImplicated`` event names it, its partners and until when), the partners that were left out because
of an edge with it are taken back, and the edges it explains are forgotten. After the exclusion it may
return (growth); cut off still, it is implicated again at its next failed start.

Two unrelated nodes that both failed to reach one healthy host would implicate the host wrongly; that
costs the job the host for one exclusion period, never correctness. Pure: time is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.core.model import JobRecord

Edge = tuple[str, str, float]  # (node that could not start, the rendezvous host it could not reach, when)


@dataclass(frozen=True)
class Verdict:
    """What a generation's failed start says about reachability: the edges to keep, the nodes implicated."""

    edges: tuple[Edge, ...]  # recent edges, the new ones included, less those the implicated nodes explain
    implicated: Mapping[str, tuple[str, ...]]  # node -> the partners it failed with (sorted)
    cleared: tuple[str, ...]  # nodes whose every recent failed start an implicated node explains


def rendezvous_edges(job: JobRecord, unstarted: Iterable[str], now: float) -> list[Edge]:
    """(node, host, now) for every node that could not start, other than the rendezvous host itself."""
    if job.layout is None:
        return []
    host = job.layout.placement[0].node
    return [(name, host, now) for name in sorted(set(unstarted)) if name != host]


def judge(job: JobRecord, new: Iterable[Edge], now: float, memory_seconds: float) -> Verdict:
    """The job's recent edges with ``new`` added, and the nodes implicated by two or more partners."""
    recent = [e for e in (*job.exclusions.rendezvous_failures, *new) if now - e[2] <= memory_seconds]
    partners: dict[str, set[str]] = {}
    for node, host, _ in recent:
        partners.setdefault(node, set()).add(host)
        partners.setdefault(host, set()).add(node)
    implicated = {n: tuple(sorted(p)) for n, p in sorted(partners.items()) if len(p) >= 2}
    explained = [e for e in recent if e[0] in implicated or e[1] in implicated]
    kept = tuple(e for e in recent if e not in explained)
    unexplained = {e[0] for e in kept}
    cleared = {n for e in explained for n in e[:2]} - set(implicated) - unexplained
    return Verdict(kept, implicated, tuple(sorted(cleared)))


def still_excluded(job: JobRecord, unstarted: Iterable[str], verdict: Verdict) -> tuple[str, ...]:
    """The nodes left out for good after ``verdict``: those that could not start, less the cleared and the
    implicated (who are left out for a while instead)."""
    dropped = {*verdict.cleared, *verdict.implicated}
    return tuple(sorted({*job.exclusions.nodes, *unstarted} - dropped))


def held_out(job: JobRecord, name: str, now: float) -> bool:
    """Whether the job leaves ``name`` out now: it could not start there, or it is implicated for a while."""
    return name in job.exclusions.nodes or any(n == name and now < until for n, until in job.exclusions.until)


def exclude_until(job: JobRecord, names: Iterable[str], until: float, now: float) -> tuple[tuple[str, float], ...]:
    """The job's timed exclusions, still running at ``now``, with ``names`` held out until ``until``."""
    names = set(names)
    kept = [(n, u) for n, u in job.exclusions.until if u > now and n not in names]
    return tuple(sorted([*kept, *((n, until) for n in names)]))
