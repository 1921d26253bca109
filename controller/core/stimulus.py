"""What triggered a decision (Dask's ``stimulus_id``): the controller's clock, a call, or a provider.

Every committed decision records one (``decisions`` table, shown beside each event's ``dN``), so "why did
the controller do that" starts from what woke it: a timer, the heartbeat of node-3's incarnation 2, an
operator cancelling job-1, the provider no longer listing a VM. A decision decides on everything observed
since the one before; its stimulus is what made it run now (the first of a burst of coalesced reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class StimulusKind(StrEnum):
    TICK = "tick"  # the controller's own clock: a timer (expiries, step progress, checkpoint requests), start, stop
    NODE_CALL = "node_call"  # an agent's call (Register, Heartbeat, ReportEvent): its node and incarnation
    JOB_CALL = "job_call"  # a client's call about a job (SubmitJob, CancelJob): the job and who called
    PROVIDER = "provider"  # the provider said something: its list of instances, the outcome of a call to it


@dataclass(frozen=True)
class Stimulus:
    """One decision's trigger. ``source`` names the timer, the RPC or the provider's fact (a label, not words)."""

    kind: StimulusKind
    source: str
    node: str | None = None
    incarnation: int | None = None  # None: a registration (the decision gives the incarnation)
    job: str | None = None
    caller: str | None = None  # the role that called (operator, agent, node)

    @classmethod
    def tick(cls, timer: str) -> Stimulus:
        return cls(StimulusKind.TICK, timer)

    @classmethod
    def node_call(
        cls, rpc: str, node: str | None, incarnation: int | None, job: str | None = None, caller: str = "node"
    ) -> Stimulus:
        return cls(StimulusKind.NODE_CALL, rpc, node=node, incarnation=incarnation, job=job, caller=caller)

    @classmethod
    def job_call(cls, rpc: str, job: str, caller: str) -> Stimulus:
        return cls(StimulusKind.JOB_CALL, rpc, job=job, caller=caller)

    @classmethod
    def provider(cls, fact: str) -> Stimulus:
        return cls(StimulusKind.PROVIDER, fact)


# The controller's own sources besides its timers (whose APScheduler ids name them).
START = "start"
STOP = "stop"
TICK = "tick"  # a tick no timer named (tests, a caller outside the daemon)
# Callers, by role (controller.api.auth.POLICY: only operators submit and cancel, agents register, nodes report).
OPERATOR = "operator"
AGENT = "agent"
