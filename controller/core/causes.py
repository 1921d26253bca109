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
    NODE_LOST = "node_lost"  # one of its nodes stopped beating or was released: ABORT
    TRAINER_START_FAILED = "start_failed"  # trainers could not start on some nodes: re-planned without them
    TRAINER_FAILED = "trainer_failed"  # trainers exited with an error: restarted, up to max_restarts
    GROW = "grow"  # free nodes whose extra throughput pays for the morph
    OTHER = "other"  # generations stored before causes were, whose detail names none of the above
