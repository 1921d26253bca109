"""Why a generation was issued, as a closed vocabulary.

A cause is a label (metrics group morphs by it, so rewording the human detail, which names nodes and
figures, never changes a Prometheus series); the detail travels beside it for people to read.
"""

from __future__ import annotations

from enum import StrEnum


class MorphCause(StrEnum):
    ADMITTED = "admitted"  # a queued job's first generation
    RESUMED = "resumed"  # a job re-queued for lack of capacity got nodes again
    EVICTION = "eviction"  # eviction notice on one of its nodes: a planned STOP
    EVICTION_RISK = "eviction_risk"  # a node at risk of eviction, and spare nodes to take its place: a planned STOP
    NODE_LOST = "node_lost"  # one of its nodes stopped beating or was released: ABORT
    TRAINER_START_FAILED = "start_failed"  # trainers could not start on some nodes: re-planned without them
    TRAINER_FAILED = "trainer_failed"  # trainers exited with an error: restarted, up to max_restarts
    PEER_UNREACHABLE = "peer_unreachable"  # a node its peers could not reach (reconcile.unreachable): left out a while
    COLLECTIVE_FAILED = "collective_failed"  # a survivor's collective failed (a peer lost without notice)
    GROW = "grow"  # free nodes whose extra throughput pays for the morph
    GROWTH_UNDONE = "growth_undone"  # the last growth measured slower than before it: back off its nodes (learn)
    ON_DEMAND_RETURNED = "on_demand_returned"  # an on-demand node it ran on was given back (reconcile.on_demand)
    SHRUNK = "shrunk"  # the scheduler gave some of its GPUs to a job worth more or starving (reconcile.sharing)
    OTHER = "other"  # generations stored before causes were, whose detail names none of the above


class JobFailureCause(StrEnum):
    """Why a job FAILED, as a label (the API's ``failure_cause``); its ``reason`` says it in words."""

    USER_ERROR = "user_error"  # its trainers refused its input (exit 2): failed at once, never restarted
    TRAINERS_FAILED = "trainers_failed"  # trainers failed more often than max_restarts
    COLLECTIVE_FAILED = "collective_failed"  # collectives failed with every node alive more often than max_restarts
    UNPLANNABLE = "unplannable"  # its profile or spec cannot be planned
    DECISIONS_FAILED = "decisions_failed"  # deciding about it failed again and again (controller.shell.failures)


class SalvageOutcome(StrEnum):
    """What became of the just-in-time checkpoint of an unplanned loss (the ``reason`` of its events)."""

    COMMITTED = "committed"  # the writers wrote the held step and it was committed: only the step in flight is lost
    ALREADY_COMMITTED = "already_committed"  # the survivors hold a step already checkpointed: nothing to write
    STAGE_LOST = "stage_lost"  # some stage lost every replica: resume from the newest periodic checkpoint
    NO_COMMON_STEP = "no_common_step"  # the stages' survivors hold different steps
    WRITER_FAILED = "writer_failed"  # a writer died or failed during the write: resume from the newest checkpoint
    TIMED_OUT = "timed_out"  # not committed by the deadline
    IN_MEMORY = "in_memory"  # the survivors keep the held step for g+1 (morph_through_memory); g+1 writes it
