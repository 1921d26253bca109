"""Per-stage costs from a profile: compute time, memory under a schedule, and balanced partitioning.

Partitioning balances the *time* of the bottleneck stage (forward + backward at the chosen
micro-batch size), not the layer count, under each stage's memory limit. The memory a stage needs
depends on its position: under 1F1B stage ``s`` of ``P`` holds the activations of ``min(P - s, M)``
micro-batches in flight, under GPipe all ``M``. On top of what it holds, running one layer's forward and
backward needs that layer's transient memory (the profile's allocator peak above its held activations,
where it was measured on a GPU) for one micro-batch.

With activation recomputation a stage holds, per micro-batch in flight, only the layers' inputs and the
stage's output (each layer's ``output_activation_bytes_per_sample``), and while one layer runs its
backward it needs that layer's whole peak again (its activations are recomputed); the backward also
reruns the forward, so it costs forward + backward.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from morphing.jobspec import Schedule
from morphing.profile import Profile

GIB = 1024**3


def in_flight(schedule: Schedule, stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations a stage holds at its peak."""
    if schedule == "gpipe":
        return micro_batches
    return min(stages - stage, micro_batches)


@dataclass(frozen=True)
class StageMemory:
    parameters: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations


@dataclass(frozen=True)
class MemoryCheck:
    """A stage's predicted peak memory against a measured one (``bench/gpu_bench.py`` measures on a GPU)."""

    stage: int
    predicted: int
    measured: int

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: positive when the model overestimates."""
        return (self.predicted - self.measured) / self.measured if self.measured else float("inf")


def compare_memory(predicted: Sequence[StageMemory], measured: Sequence[int]) -> list[MemoryCheck]:
    """Stage by stage, the planner's memory (``Plan.stage_memory``) against measured peaks in bytes."""
    if len(predicted) != len(measured):
        raise ValueError(f"{len(predicted)} predicted stages but {len(measured)} measured")
    return [MemoryCheck(s, p.total, m) for s, (p, m) in enumerate(zip(predicted, measured, strict=True))]


@dataclass(frozen=True)
class Partition:
    stage_layers: tuple[tuple[int, int], ...]
    bottleneck_seconds: float


class LayerCosts:
    """Prefix sums over the profile's layers at one micro-batch size, so any stage costs O(1)."""

    def __init__(self, profile: Profile, micro_batch_size: int, recomputation: bool = False) -> None:
        self.profile = profile
        self.micro_batch_size = micro_batch_size
        self.recomputation = recomputation
        layers = profile.layers
        self.forward = [layer.forward_seconds[micro_batch_size] for layer in layers]
        self.backward = [
            layer.backward_seconds[micro_batch_size] + (f if recomputation else 0.0)
            for layer, f in zip(layers, self.forward, strict=True)
        ]
        self._fwd = _prefix(self.forward)
        self._bwd = _prefix(self.backward)
        self._params = _prefix([float(layer.parameter_bytes) for layer in layers])
        self._act = _prefix([float(layer.activation_memory_bytes_per_sample) for layer in layers])
        self._out = _prefix([float(layer.output_activation_bytes_per_sample) for layer in layers])
        # Per sample, what running one layer needs beyond what the stage holds for it.
        self._transient = [
            float(max(layer.activation_memory_bytes_per_sample, layer.peak_memory_bytes_per_sample or 0))
            if recomputation
            else float(layer.transient_bytes_per_sample)
            for layer in layers
        ]
        # Stage memory is a difference of prefix sums unless a transient term (a max over the stage's
        # layers) or the recomputed stage's input (the previous layer's output) enters it.
        self._additive = not recomputation and not any(self._transient)
        self.state_factor = 1.0 + profile.gradient_bytes_per_parameter_byte + profile.optimizer_bytes_per_parameter_byte
        self._compute = [f + b for f, b in zip(self._fwd, self._bwd, strict=True)]
        self._memory_prefixes: dict[int, list[float]] = {}
        self._unconstrained: dict[int, Partition] = {}

    @property
    def num_layers(self) -> int:
        return len(self.forward)

    def forward_seconds(self, first: int, last: int) -> float:
        return self._fwd[last] - self._fwd[first]

    def backward_seconds(self, first: int, last: int) -> float:
        return self._bwd[last] - self._bwd[first]

    def compute_seconds(self, first: int, last: int) -> float:
        return self._compute[last] - self._compute[first]

    def parameter_bytes(self, first: int, last: int) -> float:
        return self._params[last] - self._params[first]

    def gradient_bytes(self, first: int, last: int) -> float:
        return self.parameter_bytes(first, last) * self.profile.gradient_bytes_per_parameter_byte

    def activation_bytes_out(self, last: int) -> int:
        """Bytes a stage ending before layer ``last`` sends per micro-batch."""
        return self.profile.layers[last - 1].output_activation_bytes_per_sample * self.micro_batch_size

    def activation_bytes(self, first: int, last: int, held_micro_batches: int) -> float:
        """Activation memory of a stage at its peak: what it holds for the micro-batches in flight, plus the
        transient memory of its most demanding layer for one micro-batch."""
        m = self.micro_batch_size
        if self.recomputation:
            kept = self._out[last] - self._out[max(first - 1, 0)]  # layer inputs and the stage's output
        else:
            kept = self._act[last] - self._act[first]
        return kept * held_micro_batches * m + m * max(self._transient[first:last], default=0.0)

    def memory(self, first: int, last: int, held_micro_batches: int) -> StageMemory:
        params = self.parameter_bytes(first, last)
        return StageMemory(
            parameters=round(params),
            gradients=round(params * self.profile.gradient_bytes_per_parameter_byte),
            optimizer=round(params * self.profile.optimizer_bytes_per_parameter_byte),
            activations=round(self.activation_bytes(first, last, held_micro_batches)),
        )

    def memory_total(self, first: int, last: int, held_micro_batches: int) -> float:
        if not self._additive:
            params = self._params[last] - self._params[first]
            return params * self.state_factor + self.activation_bytes(first, last, held_micro_batches)
        memory = self._memory_prefix(held_micro_batches)
        return memory[last] - memory[first]

    @cached_property
    def range_costs(self) -> list[float]:
        """Every contiguous range's compute time, sorted: the bottleneck of an optimal split is one."""
        n = self.num_layers
        return sorted(self.compute_seconds(i, j) for i in range(n) for j in range(i + 1, n + 1))

    def balanced_partition(
        self, stages: int, schedule: Schedule, micro_batches: int, memory_limit: float
    ) -> Partition | None:
        """Contiguous split into ``stages`` stages minimising the slowest stage, each within memory.

        ``None`` when no split fits in memory. Exact: the optimal bottleneck is one of the range sums,
        found by binary search with a greedy feasibility check that packs stages from the last one back
        (``_packed_from_the_back``).
        """
        unconstrained = self._time_balanced(stages)
        if self._fits(unconstrained, schedule, micro_batches, memory_limit):
            return unconstrained
        return self._search(stages, schedule, micro_batches, memory_limit)

    def _fits(self, partition: Partition, schedule: Schedule, micro_batches: int, memory_limit: float) -> bool:
        stages = len(partition.stage_layers)
        return all(
            self.memory_total(a, b, in_flight(schedule, s, stages, micro_batches)) <= memory_limit
            for s, (a, b) in enumerate(partition.stage_layers)
        )

    def _time_balanced(self, stages: int) -> Partition:
        if stages not in self._unconstrained:
            found = self._search(stages, "gpipe", 1, float("inf"))
            assert found is not None
            self._unconstrained[stages] = found
        return self._unconstrained[stages]

    def _search(self, stages: int, schedule: Schedule, micro_batches: int, memory_limit: float) -> Partition | None:
        if not self._packed_from_the_back(stages, schedule, micro_batches, memory_limit, float("inf")):
            return None
        candidates = self.range_costs
        lo = bisect.bisect_left(candidates, max(self.compute_seconds(i, i + 1) for i in range(self.num_layers)))
        hi = len(candidates) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._packed_from_the_back(stages, schedule, micro_batches, memory_limit, candidates[mid]):
                hi = mid
            else:
                lo = mid + 1
        limit = candidates[lo]
        front = self._packed_from_the_front(stages, schedule, micro_batches, memory_limit, limit)
        bounds = front or self._packed_from_the_back(stages, schedule, micro_batches, memory_limit, limit)
        assert bounds is not None
        ranges = tuple(itertools.pairwise(bounds))
        return Partition(ranges, max(self.compute_seconds(a, b) for a, b in ranges))

    def _packed_from_the_back(
        self, stages: int, schedule: Schedule, micro_batches: int, memory_limit: float, limit: float
    ) -> list[int] | None:
        """Exactly ``stages`` boundaries, each stage from the last back starting as early as ``limit`` seconds
        and memory allow while leaving a layer for every stage before it; ``None`` when none fit.

        Exact where packing from the front is not: a later stage holds fewer micro-batches under 1F1B, so
        a layer only it can hold needs every earlier stage used. If any split fits, the one with latest
        starts ``a_j`` does, and this one starts each stage no later than it (by induction from the back:
        a stage's memory only grows as it takes layers, and a layer fits a later stage if an earlier one).
        """
        n = self.num_layers
        bounds = [n]
        for stage in range(stages - 1, 0, -1):
            last = bounds[-1]
            held = in_flight(schedule, stage, stages, micro_batches)
            first = max(
                stage,
                self._nearest(self._compute, last, limit),
                self._nearest_in_memory(last, held, memory_limit, stage),
            )
            if first >= last:
                return None
            bounds.append(first)
        last = bounds[-1]
        held = in_flight(schedule, 0, stages, micro_batches)
        if self.compute_seconds(0, last) > limit or self.memory_total(0, last, held) > memory_limit:
            return None
        bounds.append(0)
        return bounds[::-1]

    def _packed_from_the_front(
        self, stages: int, schedule: Schedule, micro_batches: int, memory_limit: float, limit: float
    ) -> list[int] | None:
        """Boundaries packing each stage as far as ``limit`` seconds and memory allow, split to ``stages``.

        Preferred where it fits (the shape plans have always had); not exact on its own (see above)."""
        n = self.num_layers
        bounds = [0]
        first = 0
        while first < n:
            stage = len(bounds) - 1
            if stage >= stages:
                return None
            held = in_flight(schedule, stage, stages, micro_batches)
            last = min(
                self._furthest(self._compute, first, limit),
                self._furthest_in_memory(first, held, memory_limit),
            )
            if last == first:
                return None
            bounds.append(last)
            first = last
        return self._split_to(bounds, stages)

    def _nearest(self, prefix: list[float], last: int, limit: float) -> int:
        """Smallest ``first`` with ``prefix[last] - prefix[first] <= limit`` (prefix is non-decreasing)."""
        first = bisect.bisect_left(prefix, prefix[last] - limit, 0, last)
        while first < last and prefix[last] - prefix[first] > limit:
            first += 1
        while first > 0 and prefix[last] - prefix[first - 1] <= limit:
            first -= 1
        return first

    def _nearest_in_memory(self, last: int, held: int, memory_limit: float, floor: int) -> int:
        """Smallest ``first >= floor`` whose stage ``[first, last)`` fits, or ``last`` when no layer does."""
        if self._additive:
            return self._nearest(self._memory_prefix(held), last, memory_limit)
        if memory_limit == float("inf"):
            return floor
        first = last
        while first > floor and self.memory_total(first - 1, last, held) <= memory_limit:
            first -= 1
        return first

    def _furthest(self, prefix: list[float], first: int, limit: float) -> int:
        """Largest ``last`` with ``prefix[last] - prefix[first] <= limit`` (prefix is non-decreasing)."""
        last = bisect.bisect_right(prefix, prefix[first] + limit) - 1
        while last > first and prefix[last] - prefix[first] > limit:
            last -= 1
        while last + 1 < len(prefix) and prefix[last + 1] - prefix[first] <= limit:
            last += 1
        return last

    def _furthest_in_memory(self, first: int, held: int, memory_limit: float) -> int:
        """Largest ``last`` whose stage ``[first, last)`` fits in ``memory_limit`` (memory grows with ``last``)."""
        if self._additive:
            return self._furthest(self._memory_prefix(held), first, memory_limit)
        if memory_limit == float("inf"):
            return self.num_layers
        last = first
        while last < self.num_layers and self.memory_total(first, last + 1, held) <= memory_limit:
            last += 1
        return last

    def _memory_prefix(self, held: int) -> list[float]:
        if held not in self._memory_prefixes:
            scale = held * self.micro_batch_size
            self._memory_prefixes[held] = [
                p * self.state_factor + a * scale for p, a in zip(self._params, self._act, strict=True)
            ]
        return self._memory_prefixes[held]

    def _split_to(self, bounds: list[int], stages: int) -> list[int]:
        """Split the costliest multi-layer stages until there are ``stages`` (never raises a bottleneck)."""
        bounds = list(bounds)
        while len(bounds) - 1 < stages:
            best, index = -1.0, -1
            for k in range(len(bounds) - 1):
                a, b = bounds[k], bounds[k + 1]
                if b - a >= 2 and self.compute_seconds(a, b) > best:
                    best, index = self.compute_seconds(a, b), k
            a, b = bounds[index], bounds[index + 1]
            cut = min(range(a + 1, b), key=lambda c: max(self.compute_seconds(a, c), self.compute_seconds(c, b)))
            bounds.insert(index + 1, cut)
        return bounds


def _prefix(values: list[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out
