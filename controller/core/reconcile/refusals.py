"""Trainers that refused their input (exit 2, a user error): no restart repeats the user's mistake.

A trainer says whose mistake it was, and its agent carries that beside the exit code
(``RankReport.refusal``):

- ``user_input``: the job's own input is wrong (its entrypoint raised a user error, its dataset is
  smaller than the global batch, its model breaks a rule of the runtime). Every node would say the same,
  so the job FAILS at once, cause ``user_error``, with the trainer's message (and the rank and node that
  said it) as its reason: no restart, no node left out, ``restarts`` unchanged.
- ``node_unfit``: this node cannot run the job as asked (``device: cuda`` on a node that registered GPUs
  but whose torch sees none: a CPU build of torch, a driver gone). Another node may run it, so the nodes
  that said so are left out of the job (``exclusions.nodes``; a ``TrainerStartFailed`` event each, with the
  message) and it re-plans on the others (cause ``start_failed``), as for any node where trainers could not
  start, but without counting it as a failed rendezvous (:mod:`~controller.core.reconcile.unreachable`).
  When every node of the generation said so, none of them can run it: the job FAILS at once, cause
  ``user_error``, the reason naming the nodes and the fix.

- ``port_taken``: another process holds the generation's rendezvous port on rank 0's node (issue 44: one
  listened on later generations' ports first). Nobody's mistake and no node's: the generation ends and the next
  one, on another port (:func:`~controller.core.reconcile.generation.rendezvous_port`), starts on the same
  nodes, ``restarts`` unchanged.

A trainer that exited otherwise (a crash, a lost peer, exit 2 without its word) takes the old path:
restarted up to ``max_restarts`` (:mod:`~controller.core.reconcile.morph`).
"""

from __future__ import annotations

from dataclasses import replace

from controller.core.causes import JobFailureCause, MorphCause
from controller.core.lifecycle import JobState
from controller.core.model import Action, RankReport
from controller.core.observations import Refusal
from controller.core.reconcile.draft import Draft
from controller.core.reconcile.reports import current_reports
from controller.eventlog import facts


def refused(draft: Draft, job_id: str) -> bool:
    """Fail the job, or leave out the nodes that cannot run it, when its trainers refused their input;
    False (nothing decided) when none of the current generation did."""
    job = draft.jobs[job_id]
    refusals = sorted(
        ((name, r) for name, r in current_reports(draft, job) if not r.running and r.refusal is not None),
        key=lambda found: found[1].rank,
    )
    if not refusals:
        return False
    taken = [(name, r) for name, r in refusals if r.refusal is Refusal.PORT_TAKEN]
    if taken:  # nobody's mistake: the next generation has another port (the port follows the generation)
        name, report = taken[0]
        detail = f"{one_line(report)} (rank {report.rank} on {name}); the next generation meets on another port"
        draft.start_morph(job_id, Action.ABORT, MorphCause.TRAINER_START_FAILED, detail)
        return True
    own = [(name, r) for name, r in refusals if r.refusal is Refusal.USER_INPUT]
    if own:
        name, report = own[0]
        _fail(draft, job_id, f"{one_line(report)} (rank {report.rank} on {name})")
        return True
    unfit: dict[str, str] = {}
    for name, report in refusals:
        unfit.setdefault(name, one_line(report))
    names = ", ".join(sorted(unfit))
    why = next(iter(unfit.values()))
    if set(job.nodes) <= set(unfit):
        _fail(draft, job_id, f"no node of generation {job.generation} can run it ({names}): {why}")
        return True
    for name, error in sorted(unfit.items()):
        draft.event(facts.TrainerStartFailed(job.generation, error), job_id, name)
    detail = f"{names} cannot run it ({why}); re-planning without {'it' if len(unfit) == 1 else 'them'}"
    excluded = replace(job.exclusions, nodes=tuple(sorted({*job.exclusions.nodes, *unfit})))
    draft.start_morph(job_id, Action.ABORT, MorphCause.TRAINER_START_FAILED, detail, exclusions=excluded)
    return True


def one_line(report: RankReport) -> str:
    """The trainer's message, its first line (a user error is one line; a log tail may not be)."""
    lines = report.error.strip().splitlines()
    return lines[0] if lines else f"exit code {report.exit_code}"


def _fail(draft: Draft, job_id: str, reason: str) -> None:
    job = draft.jobs[job_id]
    draft.move_job(job_id, JobState.FAILED, reason, failure_cause=JobFailureCause.USER_ERROR)
    draft.release_nodes(job_id, job.nodes, "job failed")
