"""Planners per job: built from the job's profile file, and remembering their answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from controller.core.lifecycle import JOB_LIVE
from controller.core.model import JobRecord, World
from controller.core.reconcile.config import PlannerFor, Unplannable
from controller.shell.profiles import read_profile
from morphing.errors import UserInputError
from morphing.layout import Layout
from morphing.planner import Planner, PlanResult


class MemoPlanner(Planner):
    """A planner that remembers its recent answers (planning is a pure function of its inputs).

    Reconcile runs at every state change and every tick, and the growth check asks the same question
    each time (the best plan on the job's nodes plus the free ones): on ~1,000 GPUs that is most of a
    second, so it is answered once per distinct set of nodes, not once per reconcile.
    """

    # The layout chosen by liveput (scheduler.layouts.steadiest) asks the best plan at every pipeline depth of a GPU
    # count and evaluates what a loss leaves each: 2 x 48 questions for GPT-48, asked again every growth check.
    MAX_REMEMBERED = 512

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plans: dict[tuple[tuple[tuple[str, int], ...], int | None, int], PlanResult] = {}
        self._evaluated: dict[Layout, PlanResult] = {}
        self._sweeps: dict[tuple[int, int], list[PlanResult]] = {}

    def what_if(self, max_gpus: int, gpus_per_node: int = 1) -> list[PlanResult]:
        """The sweep the scheduler's throughput curve comes from (``scheduler.jobs.throughput_curve``), asked every
        pass while on-demand capacity is in play: swept once per (max GPUs, GPUs per node) of this job's spec."""
        key = (max_gpus, gpus_per_node)
        found = self._sweeps.get(key)
        if found is None:
            found = super().what_if(max_gpus, gpus_per_node)
            if len(self._sweeps) >= self.MAX_REMEMBERED:
                self._sweeps.clear()
            self._sweeps[key] = found
        return list(found)

    def plan(self, nodes: Sequence[tuple[str, int]], stages: int | None = None, least_gpus: int = 1) -> PlanResult:
        key = (tuple(nodes), stages, least_gpus)
        found = self._plans.get(key)
        if found is None:
            found = super().plan(nodes, stages, least_gpus)
            if len(self._plans) >= self.MAX_REMEMBERED:
                self._plans.clear()
            self._plans[key] = found
        return found

    def evaluate(self, layout: Layout) -> PlanResult:
        found = self._evaluated.get(layout)
        if found is None:
            found = super().evaluate(layout)
            if len(self._evaluated) >= self.MAX_REMEMBERED:
                self._evaluated.clear()
            self._evaluated[layout] = found
        return found


class Planners:
    """One planner per job, built once per spec (a job id reused after a rolled-back submit gets its own)."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[object, PlannerFor]] = {}

    def __call__(self, job: JobRecord) -> PlannerFor:
        """The job's planner, or why none can be built (its profile cannot be read or is not valid)."""
        cached = self._built.get(job.id)
        if cached is not None and cached[0] is job.spec:
            return cached[1]
        try:
            spec = job.spec
            profile = read_profile(spec.profile)
            built: PlannerFor = MemoPlanner(
                profile,
                spec.global_batch,
                spec.schedule,
                recomputation=spec.activation_recomputation,
                micro_batch_size=spec.micro_batch_size if spec.exact else None,  # exact: the unit is fixed
                snapshot_interval=spec.snapshot_interval if spec.morph_through_memory else 0,
            )
        except UserInputError as exc:
            built = Unplannable(str(exc))
        self._built[job.id] = (job.spec, built)
        return built

    def live(self, world: World) -> dict[str, PlannerFor]:
        """The planners of the world's live jobs, as a reconcile pass is given them."""
        return {j.id: self(j) for j in world.jobs.values() if j.state in JOB_LIVE}
