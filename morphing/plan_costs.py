"""The planner's cost model of one candidate: per-stage compute and bytes, the sends between stages, the
gradients' all-reduces, and the lower bound the search prunes by (:mod:`morphing.planner`). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from morphing.profile import ClusterProfile
from morphing.simulator import StageTiming


@dataclass(frozen=True)
class StageBase:
    """A partition's per-stage compute and bytes at one micro-batch size (placement-free)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    out_bytes: tuple[int, ...]
    grad_bytes: tuple[float, ...]


def sends(cluster: ClusterProfile, base: StageBase, cross: tuple[bool, ...]) -> list[float]:
    inter_bw, inter_lat = (
        cluster.inter_node_bandwidth_bytes_per_second,
        cluster.inter_node_latency_seconds,
    )
    intra_bw, intra_lat = (
        cluster.intra_node_bandwidth_bytes_per_second,
        cluster.intra_node_latency_seconds,
    )
    sends = [
        base.out_bytes[s] / inter_bw + inter_lat if crossing else base.out_bytes[s] / intra_bw + intra_lat
        for s, crossing in enumerate(cross)
    ]
    sends.append(0.0)
    return sends


def allreduces(cluster: ClusterProfile, base: StageBase, replicas: int, one_node: tuple[bool, ...]) -> list[float]:
    """Ring all-reduce: ``2 (D - 1) / D`` of the bytes over the slowest link, ``2 (D - 1)`` hops."""
    if replicas <= 1:
        return [0.0] * len(base.grad_bytes)
    intra = cluster.intra_node_bandwidth_bytes_per_second
    factor = 2 * (replicas - 1) / replicas
    hops = 2 * (replicas - 1)
    local = (intra, cluster.intra_node_latency_seconds)
    remote = (
        min(cluster.allreduce_bandwidth_bytes_per_second, intra),
        max(cluster.inter_node_latency_seconds, cluster.intra_node_latency_seconds),
    )
    out = []
    for grad, single in zip(base.grad_bytes, one_node, strict=True):
        bw, lat = local if single else remote
        out.append(factor * grad / bw + hops * lat if grad > 0 else 0.0)
    return out


def timings(base: StageBase, sends: list[float], allreduce: list[float]) -> list[StageTiming]:
    return [StageTiming(f, b, c, a) for f, b, c, a in zip(base.forward, base.backward, sends, allreduce, strict=True)]


def lower_bound(base: StageBase, sends: list[float], allreduce: list[float], micro_batches: int) -> float:
    """No schedule beats this: see the module docstring."""
    best = 0.0
    before_fwd = before_bwd = 0.0
    for f, b, c, a in zip(base.forward, base.backward, sends, allreduce, strict=True):
        bound = before_fwd + micro_batches * (f + b) + (before_bwd if before_bwd > a else a)
        if bound > best:
            best = bound
        before_fwd += f + c
        before_bwd += b + c
    return best
