"""The planner: the layout with the best predicted samples/s for the GPUs at hand.

Candidates are every pipeline depth ``P``, every profiled micro-batch size ``m`` and every replica
count ``D`` with ``P * D`` GPUs available. Two facts keep the search small and still exact within
the model:

- For fixed ``(P, m)``, ``D`` only matters through ``M = ceil(B / (D m))`` micro-batches per replica
  and through communication costs that never fall as ``D`` grows; so per distinct ``M`` only the
  smallest ``D`` is a candidate.
- Every candidate has a cheap lower bound on its step time (a stage cannot start before the first
  micro-batch reaches it, must do ``M`` forwards and backwards, and its last gradient must travel
  back to stage 0 or be all-reduced). Candidates are simulated best bound first, and the search
  stops when no remaining bound can beat the best simulated plan.

Ranks are placed replica by replica on the GPUs in node order, so a replica's stages share a node
where they can. A plan for ``n + 1`` GPUs sees every candidate of the plan for ``n`` at the same
cost, so predicted throughput never falls as GPUs are added (the planner may leave GPUs idle).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from morphing import plan_costs
from morphing.errors import UserInputError
from morphing.jobspec import SCHEDULES, Schedule
from morphing.layout import Layout, contiguous_placement, local_nodes
from morphing.plan_costs import StageBase, lower_bound
from morphing.plan_result import Infeasible, Plan, PlanResult, throughput
from morphing.profile import Profile
from morphing.simulator import simulate
from morphing.slots import SlotSpace, check_counts
from morphing.snapshots import SnapshotVerdict, judge
from morphing.stages import GIB, LayerCosts, Partition, in_flight

__all__ = ["Infeasible", "Plan", "PlanResult", "Planner", "throughput"]


@dataclass(order=True)
class _Candidate:
    bound: float
    gpus_used: int
    stages: int = field(compare=False)
    replicas: int = field(compare=False)
    micro_batch_size: int = field(compare=False)
    micro_batches: int = field(compare=False)
    partition: Partition = field(compare=False)


@dataclass(frozen=True)
class _Best:
    step: float
    candidate: _Candidate


class Planner:
    """Plans for one model (profile), global batch and schedule; caches work across GPU counts."""

    def __init__(
        self,
        profile: Profile,
        global_batch: int,
        schedule: Schedule = "1f1b",
        gpu_memory_bytes: int | None = None,
        recomputation: bool = False,
        micro_batch_size: int | None = None,
        snapshot_interval: int = 0,
    ) -> None:
        """``micro_batch_size``: plan only that size (an exact job's, which its result depends on);
        ``snapshot_interval``: the job's peer snapshots (0: none), which a plan accounts for (:meth:`snapshots`)."""
        if global_batch <= 0:
            raise UserInputError(f"global batch {global_batch}: it must be >= 1 (samples per optimizer step)")
        if schedule not in SCHEDULES:
            raise UserInputError(f"schedule {schedule!r} is unknown; use one of: {', '.join(SCHEDULES)}")
        if gpu_memory_bytes is not None:
            if gpu_memory_bytes <= 0:
                raise UserInputError(f"GPU memory {gpu_memory_bytes} bytes: it must be > 0")
            profile = profile.with_gpu_memory(gpu_memory_bytes)
        self.profile = profile
        self.global_batch = global_batch
        self.schedule: Schedule = schedule
        self.memory_limit = float(profile.cluster.gpu_memory_bytes)
        self.recomputation = recomputation  # the job's activation_recomputation: less memory, slower backward
        self.snapshot_interval = snapshot_interval
        sizes = profile.micro_batch_sizes
        if micro_batch_size is not None:
            if micro_batch_size not in sizes:
                raise UserInputError(
                    f"micro_batch_size {micro_batch_size} was not profiled (profiled: {list(sizes)}); an exact job "
                    "runs only that size: profile it (spotmorph profile --micro-batch-sizes)"
                )
            sizes = (micro_batch_size,)
        self.costs = {m: LayerCosts(profile, m, recomputation) for m in sizes}
        self._partitions: dict[tuple[int, int, int], Partition | None] = {}
        self._pipelines: dict[tuple[object, ...], tuple[float, ...]] = {}
        self._bases: dict[tuple[int, tuple[tuple[int, int], ...], float], StageBase] = {}

    @property
    def num_layers(self) -> int:
        return len(self.profile.layers)

    def plan_gpus(self, gpus: int, gpus_per_node: int = 1) -> PlanResult:
        check_counts(gpus, gpus_per_node)
        return self.plan(local_nodes(gpus, gpus_per_node))

    def plan(self, nodes: Sequence[tuple[str, int]], stages: int | None = None, least_gpus: int = 1) -> PlanResult:
        """Best layout on ``nodes`` (``(name, free slots)`` in placement order), optionally with ``stages``, using
        at least ``least_gpus`` of them (so that it reaches the first nodes holding that many slots)."""
        space = SlotSpace(nodes)
        if space.gpus <= 0:
            return Infeasible(0, "no GPUs available")
        every = self._candidates(space, stages)
        best = self._search(space, [c for c in every if c.gpus_used >= least_gpus], None)
        if best is None and least_gpus > 1 and self._search(space, every, None) is not None:
            return Infeasible(space.gpus, f"no layout that fits uses {least_gpus} or more of the {space.gpus} GPUs")
        return self._result(space, best)

    def smallest_pipeline(self) -> int | None:
        """The fewest stages whose layers fit in GPU memory (one replica), or ``None`` if none do."""
        m = min(self.costs)
        micro_batches = -(-self.global_batch // m)
        return next(
            (p for p in range(1, self.num_layers + 1) if self._partition(p, m, micro_batches) is not None), None
        )

    def what_if(self, max_gpus: int, gpus_per_node: int = 1) -> list[PlanResult]:
        """Plans for 1..max_gpus GPUs in one sweep.

        The plan for ``n`` GPUs is the best of the plan for ``n - 1`` and the candidates that use
        exactly ``n`` GPUs: a candidate's cost does not depend on GPUs it leaves idle.
        """
        check_counts(max_gpus, gpus_per_node)
        space = SlotSpace(local_nodes(max_gpus, gpus_per_node))
        by_gpus: dict[int, list[_Candidate]] = {}
        for cand in self._candidates(space):
            by_gpus.setdefault(cand.gpus_used, []).append(cand)
        results: list[PlanResult] = []
        best: _Best | None = None
        for gpus in range(1, max_gpus + 1):
            best = self._search(space, by_gpus.get(gpus, []), best)
            results.append(self._result(space.prefix(gpus), best))
        return results

    def _candidates(self, space: SlotSpace, only_stages: int | None = None) -> list[_Candidate]:
        """Every layout worth simulating on ``space``, with its lower bound (see the module docstring)."""
        out = []
        depths = range(1, min(self.num_layers, space.gpus) + 1)
        for stages in depths if only_stages is None else [p for p in depths if p == only_stages]:
            for m in self.costs:
                for replicas, micro_batches in self._replica_choices(space.gpus // stages, m):
                    partition = self._partition(stages, m, micro_batches)
                    if partition is None:
                        continue
                    cross, one_node, crowding = space.facts(stages, replicas)
                    base = self._base(m, partition, self._slowdown(crowding))
                    sends = plan_costs.sends(self.profile.cluster, base, cross)
                    allreduce = plan_costs.allreduces(self.profile.cluster, base, replicas, one_node)
                    bound = lower_bound(base, sends, allreduce, micro_batches)
                    out.append(_Candidate(bound, stages * replicas, stages, replicas, m, micro_batches, partition))
        return out

    def _search(self, space: SlotSpace, candidates: list[_Candidate], best: _Best | None) -> _Best | None:
        """Simulate candidates best bound first until no bound can beat the best step time."""
        heapq.heapify(candidates)
        while candidates and (best is None or candidates[0].bound < best.step):
            cand = heapq.heappop(candidates)
            step = self._step_seconds(space, cand)
            if best is None or (step, cand.gpus_used) < (best.step, best.candidate.gpus_used):
                best = _Best(step, cand)
        return best

    def _result(self, space: SlotSpace, best: _Best | None) -> PlanResult:
        if best is None:
            return Infeasible(space.gpus, self._why_nothing_fits(space.gpus))
        cand = best.candidate
        layout = Layout(
            pipeline_stages=cand.stages,
            data_parallel=cand.replicas,
            micro_batch_size=cand.micro_batch_size,
            global_batch=self.global_batch,
            stage_layers=cand.partition.stage_layers,
            placement=contiguous_placement(cand.gpus_used, space.nodes),
        )
        result = self.evaluate(layout)
        assert isinstance(result, Plan)
        verdict = self.snapshots(layout)
        notes = self._notes(space.gpus, result) + (verdict.notes if verdict is not None else ())
        return replace(result, gpus=space.gpus, notes=notes)

    def snapshots(self, layout: Layout) -> SnapshotVerdict | None:
        """The peer snapshots ``layout`` takes, their host memory per node (each stage's parameters and optimizer
        state, by the profile) against the profile's ``host_memory_bytes``, and whether they are refused; None
        for a job without snapshots."""
        if self.snapshot_interval <= 0:
            return None
        per_layer = [
            layer.parameter_bytes * (1 + self.profile.optimizer_bytes_per_parameter_byte)
            for layer in self.profile.layers
        ]
        stage_bytes = [int(sum(per_layer[a:b])) for a, b in layout.stage_layers]
        return judge(layout, stage_bytes, self.profile.cluster.host_memory_bytes)

    def best_by_exhaustion(self, nodes: Sequence[tuple[str, int]]) -> float:
        """Best samples/s over every (P, m, D) on ``nodes``, each simulated: no pruning, no bounds.

        The slow reference the pruned search must equal (tests and ``bench/plan_bench.py``).
        """
        gpus = sum(slots for _name, slots in nodes)
        best = 0.0
        for stages in range(1, min(self.num_layers, gpus) + 1):
            for m in self.costs:
                for replicas in range(1, min(gpus // stages, self.global_batch) + 1):
                    partition = self._partition(stages, m, -(-self.global_batch // (replicas * m)))
                    if partition is None:
                        continue
                    placement = contiguous_placement(stages * replicas, nodes)
                    layout = Layout(stages, replicas, m, self.global_batch, partition.stage_layers, placement)
                    best = max(best, throughput(self.evaluate(layout)))
        return best

    def evaluate(self, layout: Layout) -> PlanResult:
        """Predicted cost of a given layout (any placement), or why it does not fit in memory."""
        if layout.num_layers != self.num_layers:
            raise UserInputError(f"layout covers {layout.num_layers} layers but the profile has {self.num_layers}")
        m = layout.micro_batch_size
        if m not in self.costs:
            raise UserInputError(
                f"micro-batch size {m} was not profiled; profiled sizes: {list(self.profile.micro_batch_sizes)}"
            )
        costs = self.costs[m]
        stages, micro_batches = layout.pipeline_stages, layout.max_micro_batches
        held = [in_flight(self.schedule, s, stages, micro_batches) for s in range(stages)]
        memory = tuple(costs.memory(a, b, h) for (a, b), h in zip(layout.stage_layers, held, strict=True))
        for s, ((a, b), h) in enumerate(zip(layout.stage_layers, held, strict=True)):
            need = costs.memory_total(a, b, h)
            if need > self.memory_limit:
                return Infeasible(
                    layout.world_size,
                    f"memory: stage {s} needs {need / GIB:.2f} GiB > {self.memory_limit / GIB:.2f} GiB per GPU",
                )
        cross = tuple(
            any(
                layout.placement[layout.rank(d, s)].node != layout.placement[layout.rank(d, s + 1)].node
                for d in range(layout.data_parallel)
            )
            for s in range(stages - 1)
        )
        one_node = tuple(
            len({layout.placement[layout.rank(d, s)].node for d in range(layout.data_parallel)}) == 1
            for s in range(stages)
        )
        crowding = max(Counter(slot.node for slot in layout.placement).values())
        base = self._base(m, Partition(layout.stage_layers, 0.0), self._slowdown(crowding))
        timings = plan_costs.timings(
            base,
            plan_costs.sends(self.profile.cluster, base, cross),
            plan_costs.allreduces(self.profile.cluster, base, layout.data_parallel, one_node),
        )
        sim = simulate(timings, micro_batches, self.schedule)
        return Plan(
            layout,
            self.schedule,
            layout.world_size,
            sim.step_seconds,
            self.global_batch / sim.step_seconds,
            sim.bubble_fraction,
            memory,
        )

    def _replica_choices(self, max_replicas: int, m: int) -> list[tuple[int, int]]:
        """Smallest ``D`` for each distinct micro-batch count ``M``, with ``D <= max_replicas, B``."""
        limit = min(max_replicas, self.global_batch)
        out: list[tuple[int, int]] = []
        replicas = 1
        while replicas <= limit:
            micro_batches = -(-self.global_batch // (replicas * m))
            out.append((replicas, micro_batches))
            if micro_batches == 1:
                break
            replicas = -(-self.global_batch // ((micro_batches - 1) * m))
        return out

    def _partition(self, stages: int, m: int, micro_batches: int) -> Partition | None:
        key_m = micro_batches if self.schedule == "gpipe" else min(micro_batches, stages)
        key = (stages, m, key_m)
        if key not in self._partitions:
            self._partitions[key] = self.costs[m].balanced_partition(stages, self.schedule, key_m, self.memory_limit)
        return self._partitions[key]

    def _slowdown(self, crowding: int) -> float:
        """How much slower compute runs with ``crowding`` ranks on one node that has fewer compute slots."""
        slots = self.profile.cluster.compute_slots_per_node
        return max(1.0, crowding / slots) if slots else 1.0

    def _base(self, m: int, partition: Partition, slowdown: float = 1.0) -> StageBase:
        key = (m, partition.stage_layers, slowdown)
        base = self._bases.get(key)
        if base is None:
            costs = self.costs[m]
            ranges = partition.stage_layers
            base = StageBase(
                forward=tuple(costs.forward_seconds(a, b) * slowdown for a, b in ranges),
                backward=tuple(costs.backward_seconds(a, b) * slowdown for a, b in ranges),
                out_bytes=tuple(costs.activation_bytes_out(b) for _a, b in ranges),
                grad_bytes=tuple(costs.gradient_bytes(a, b) for a, b in ranges),
            )
            self._bases[key] = base
        return base

    def _step_seconds(self, space: SlotSpace, cand: _Candidate) -> float:
        cross, one_node, crowding = space.facts(cand.stages, cand.replicas)
        slowdown = self._slowdown(crowding)
        base = self._base(cand.micro_batch_size, cand.partition, slowdown)
        key = (cand.micro_batch_size, cand.micro_batches, cross, cand.partition.stage_layers, slowdown)
        finish = self._pipelines.get(key)
        if finish is None:
            timings = plan_costs.timings(base, plan_costs.sends(self.profile.cluster, base, cross), [0.0] * cand.stages)
            finish = simulate(timings, cand.micro_batches, self.schedule).stage_finish
            self._pipelines[key] = finish
        allreduce = plan_costs.allreduces(self.profile.cluster, base, cand.replicas, one_node)
        return max(end + a for end, a in zip(finish, allreduce, strict=True))

    def _why_nothing_fits(self, gpus: int) -> str:
        limit = self.memory_limit / GIB
        m = min(self.costs)
        micro_batches = -(-self.global_batch // m)
        stages = self.smallest_pipeline()
        if stages is not None:
            return (
                f"memory: no layout of {gpus} GPU(s) fits the model in {limit:.2f} GiB per GPU; "
                f"it needs a pipeline of at least {stages} stages, so use --gpus >= {stages} "
                "or GPUs with more memory (--gpu-memory-gib)"
            )
        costs = self.costs[m]
        worst = max(
            range(self.num_layers),
            key=lambda i: costs.memory_total(i, i + 1, in_flight(self.schedule, 0, 1, micro_batches)),
        )
        need = costs.memory_total(worst, worst + 1, 1) / GIB
        return (
            f"memory: even one layer per stage does not fit: layer {worst} "
            f"({self.profile.layers[worst].name}) needs {need:.2f} GiB > {limit:.2f} GiB per GPU; "
            "use GPUs with more memory (--gpu-memory-gib)"
        )

    def _notes(self, gpus: int, plan: Plan) -> tuple[str, ...]:
        notes = []
        m = min(self.costs)
        smallest = next((p for p in range(1, self.num_layers + 1) if self._partition(p, m, p) is not None), None)
        if smallest and smallest > 1:
            notes.append(f"P < {smallest} rejected: memory (a stage would exceed the GPU memory)")
        if gpus // plan.layout.pipeline_stages > self.global_batch:
            notes.append(f"D capped at the global batch ({self.global_batch}): a replica needs >= 1 sample")
        idle = gpus - plan.gpus_used
        if idle:
            notes.append(f"{idle} GPU(s) left idle: using them would not raise predicted samples/s")
        return tuple(notes)
