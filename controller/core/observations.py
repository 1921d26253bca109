"""What agents report with every heartbeat: kept in memory only, since the next beat sends it again.

Losing observations (a controller restart) only delays decisions until the next heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from morphing.transfer import HeldSkipCause


class Refusal(StrEnum):
    """A trainer that exited with a user error (exit 2), by whose mistake it was; never restarted as it is."""

    USER_INPUT = "user_input"  # the job's own input (entrypoint, model, dataset): the same on every node
    NODE_UNFIT = "node_unfit"  # this node cannot run the job as asked (device cuda, its torch sees no GPU)
    PORT_TAKEN = "port_taken"  # another process holds the generation's rendezvous port: a new port, no restart


@dataclass(frozen=True)
class RankReport:
    """One trainer as an agent sees it."""

    job: str
    generation: int
    rank: int
    running: bool
    exit_code: int | None = None
    last_step: int = 0
    last_checkpoint_step: int = 0
    error: str = ""
    eval_step: int = 0  # the step of its newest evaluation (0: none yet)
    eval_loss: float | None = None
    first_step_at: float | None = None  # the node's wall clock when this rank completed its first step
    first_step_seconds: float | None = None  # ... how long that step took (None: an older agent said not)
    last_step_at: float | None = None  # ... and ``last_step``
    held_step: int | None = None  # its collective failed: the last completed step it holds in memory
    snapshot_own_steps: tuple[int, ...] = ()  # ... and the peer snapshots it keeps: copies of its own stage ...
    snapshot_received_steps: tuple[int, ...] = ()  # ... and copies of the stages it protects, received whole
    refusal: Refusal | None = None  # it exited 2, refusing its input (None: not a refusal)
    stall_step: int = 0  # the step of its newest checkpoint ...
    stall_seconds: float | None = None  # ... and how long that checkpoint paused it (None: none reported yet)
    held_skipped: str = ""  # it did not take the step the previous generation held in memory: why
    held_skipped_cause: HeldSkipCause | None = None  # ... and its class (None: unsaid, by an older agent)
    hand_off_failed: str = ""  # at its generation's stop for an eviction, the hand-off failed: why
    loss: float | None = None  # the global-batch training loss of last_step (None: none reported)
    samples_per_second: float | None = None  # the rate last_step ran at


@dataclass(frozen=True)
class EvictionRisk:
    """The cloud's early warning that a VM is at elevated risk of eviction, before any notice (an AWS rebalance
    recommendation, Azure's eviction-risk signal): a reason to give the node no new work and, where spare capacity
    exists, to move its job off it while that costs only a planned morph."""

    noticed_at: float  # the node's wall clock when its agent first saw the warning
    source: str  # where it came from, e.g. "aws-rebalance-recommendation" (bounded, printable: api.reports)


@dataclass(frozen=True)
class NodeObservation:
    incarnation: int
    last_seen: float
    ranks: tuple[RankReport, ...] = ()
    eviction_not_before: float | None = None
    building: str = ""  # a job whose model a warm trainer here is building ahead (a growth hint's), not yet built
    risk: EvictionRisk | None = None  # the cloud warns this VM may be evicted soon (None: no warning now)
