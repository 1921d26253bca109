"""What reconcile is tuned by, and the planners it is given per job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.core.flapping import Damping
from morphing.planner import Planner
from morphing.policy import PolicyConfig
from scheduler.policy import SchedulerConfig


@dataclass(frozen=True)
class Config:
    heartbeat_expiry_seconds: float = 10.0
    lost_to_gone_seconds: float = 120.0
    gone_retention_seconds: float = 3600.0  # a GONE node's record is forgotten after this (events stay)
    debounce_seconds: float = 5.0
    stop_timeout_seconds: float = 120.0  # a STOP not done by then becomes ABORT
    abort_timeout_seconds: float = 30.0  # survivors that never confirm are given up on
    suspect_grace_seconds: float = 1.5  # after a failed collective, nodes silent this long are taken for lost
    salvage_write_seconds: float = 30.0  # a just-in-time checkpoint not committed by then is given up
    progress_event_seconds: float = 60.0  # a job's TrainingProgressed events at most this often
    unreachable_memory_seconds: float = 900.0  # failed starts remembered to find a node its peers cannot reach
    unreachable_exclusion_seconds: float = 300.0  # ... which the job then leaves out this long
    morph_cost_seconds: float = 30.0
    warm_build_wait_seconds: float = 60.0  # a growth waits this long after a node joined for its warm build
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rendezvous_port_base: int = 29500
    rendezvous_port_span: int = 500
    # Mixed into each generation's port: without it (tests) a port follows from the job and generation alone, so a
    # local process could listen on a later generation's port first (controller.tokens.Tokens.rendezvous_salt).
    rendezvous_salt: str = ""
    damping: Damping = field(default_factory=Damping)  # nodes that come back soon after LOST: quarantined in JOINING
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # on-demand for deadlines (reconcile.on_demand)
    on_demand_gpu_hour_price: float = 3.0  # dollars: turns a job's on_demand_max_dollars into GPUs
    growth_undo_seconds: float = 3600.0  # a growth undone leaves its nodes out this long (and is never retried)
    curve_max_gpus: int = 64  # the scheduler's throughput curves stop here (one planner sweep per job and pass)


@dataclass(frozen=True)
class Unplannable:
    """Why no planner could be built for a job (its profile cannot be read, or is not a valid one)."""

    reason: str


PlannerFor = Planner | Unplannable  # what the shell hands reconcile for one job
Planners = Mapping[str, PlannerFor]  # job id -> its planner, or why it has none
