"""What agents report, fenced: only a node's current incarnation speaks, only about the current generation.

Every step that reads rank reports reads them here, so the fencing rule (reports of another
incarnation or generation never change a job) is written once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from controller.core.lifecycle import NodeState
from controller.core.model import Action, JobRecord, NodeObservation, RankReport
from controller.core.reconcile.draft import Draft


def observation(draft: Draft, name: str) -> NodeObservation | None:
    """What the node's current incarnation last reported (``None``: nothing, or only an older one)."""
    seen = draft.observed.get(name)
    node = draft.nodes.get(name)
    if seen is None or node is None or seen.incarnation != node.incarnation:
        return None
    return seen


def current_reports(
    draft: Draft, job: JobRecord, names: Iterable[str] | None = None
) -> Iterator[tuple[str, RankReport]]:
    """(node, report) for every rank of ``job``'s current generation on ``names`` (default: its nodes)."""
    for name in job.nodes if names is None else names:
        seen = observation(draft, name)
        for report in seen.ranks if seen else ():
            if report.job == job.id and report.generation == job.generation:
                yield name, report


@dataclass(frozen=True)
class Census:
    """How a job's ranks stand, counted on the nodes that still serve it."""

    expected: int  # ranks in the current layout
    done: int  # ranks of the current generation that exited 0 after the last step
    failed: int  # ranks of the current generation that exited otherwise while told to RUN
    quiet: bool  # every serving node reported since the morph began and runs no rank of this job

    @property
    def finished(self) -> bool:
        return self.expected > 0 and self.done == self.expected


def census(draft: Draft, job: JobRecord) -> Census:
    # lost, gone, new incarnations run nothing; nodes suspected lost after a failed collective are not waited for
    serving = [name for name in job.nodes if draft.serves(job, name) and name not in job.salvage.suspected]
    reporting = [name for name in serving if _reported_since_morph(job, observation(draft, name))]
    quiet = len(reporting) == len(serving) and not any(
        r.running for name in reporting for r in _ranks_up_to_current(job, observation(draft, name))
    )
    # A node with a notice: its agent may have stopped the generation on its own while no controller led (exit 0
    # at a step boundary, as a planned STOP ends), which is the eviction's stop, not a failure.
    noticed = any(n in draft.nodes and draft.nodes[n].state is NodeState.DRAINING for n in job.nodes)
    done = failed = 0
    for _, report in current_reports(draft, job, reporting):
        if report.running:
            continue
        if report.exit_code == 0 and report.last_step >= job.spec.steps:
            done += 1
        elif job.action is Action.RUN and not (noticed and report.exit_code == 0):
            failed += 1
    return Census(job.layout.world_size if job.layout else 0, done, failed, quiet)


def start_failures(draft: Draft, job: JobRecord) -> dict[str, str]:
    """Node -> error, where a trainer of the current generation exited with an error before its first step."""
    found: dict[str, str] = {}
    for name, report in current_reports(draft, job):
        if report.exit_code and report.last_step <= job.resume.step:
            found.setdefault(name, report.error or f"exit code {report.exit_code}")
    return found


def first_error(draft: Draft, job: JobRecord) -> str:
    """The first error message a failed trainer of the current generation left ("" if none did)."""
    return next((r.error for _, r in current_reports(draft, job) if r.exit_code and r.error), "")


def _reported_since_morph(job: JobRecord, seen: NodeObservation | None) -> bool:
    """Whether the node reported at all (since the morph began, if one did): else it may still be starting trainers."""
    return seen is not None and (job.morph.started_at is None or seen.last_seen >= job.morph.started_at)


def _ranks_up_to_current(job: JobRecord, seen: NodeObservation | None) -> Iterator[RankReport]:
    """This job's ranks of the current or an older generation: any of them still running holds a slot."""
    for report in seen.ranks if seen else ():
        if report.job == job.id and report.generation <= job.generation:
            yield report
