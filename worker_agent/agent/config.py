"""The agent's configuration and what it remembers between beats: values the loop, the eviction side
(:mod:`~worker_agent.agent.evictions`) and the tests share, in a module of their own so neither imports the loop."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from worker_agent.agent import refusals
from worker_agent.agent.converge import Assignment, TrainerKey
from worker_agent.agent.decisions import ALONE_AFTER_SECONDS, EvictionNotice, EvictionRisk, Pushed, StoppedAlone
from worker_agent.agent.gpus import Gpu
from worker_agent.agent.supervisor import LaunchSpec
from worker_agent.agent.wire import Registration
from worker_agent.agent.zygote import InheritedProcess
from worker_agent.notices.facts import Cloud


@dataclass(frozen=True)
class AgentConfig:
    controllers: tuple[str, ...]  # any of them may lead (:mod:`worker_agent.agent.addresses`)
    token: str
    work_dir: Path
    slots: int = 1
    gpus: tuple[Gpu, ...] = ()  # slot i trains on gpus[i] (never more slots than GPUs: gpus.slot_count)
    name: str = ""
    address: str = "127.0.0.1"
    socket_interface: str | None = None  # the interface holding ``address``: trainers bind collectives to it
    instance_id: str = ""
    imds_url: str | None = None  # the cloud's metadata service (None: no notices are watched)
    cloud: Cloud = "azure"  # whose notices it serves (worker_agent.notices)
    vm_name: str | None = None
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    poll_seconds: float = 1.0
    max_backoff_seconds: float = 10.0
    warm_trainers: int = 0
    trainer_python: str = sys.executable
    local_poll_seconds: float = 0.1
    morph_beat_seconds: float = 0.2
    lease_seconds: float | None = None  # None: six times the controller's heartbeat expiry
    zygote: InheritedProcess | None = None  # one this process started before it was the agent (a local VM's)
    alone_after_seconds: float = ALONE_AFTER_SECONDS  # a notice no controller heard of: the trainers stop alone


@dataclass
class AgentState:
    """What the agent remembers between beats (nothing here is needed to survive a restart)."""

    node: Registration
    interval: float = 1.0
    healthy: bool = True
    desired: Assignment | None = None
    launch: dict[tuple[str, int], LaunchSpec] = field(default_factory=dict)
    pushed: Pushed = field(default_factory=Pushed)
    notice: EvictionNotice | None = None
    risk: EvictionRisk | None = None  # the cloud's early warning, until withdrawn
    noticed_at: float = 0.0  # time.monotonic() when ``notice`` came
    heard: str = ""  # the event id of the last notice a controller answered a call carrying
    stopped_alone: StoppedAlone | None = None  # done on the agent's own, not yet told to a controller
    last_contact: float = 0.0  # time.monotonic() of the controller's last answer
    withheld: refusals.Withheld = field(default_factory=refusals.Withheld)  # measurements the controller refused
    adjusted: set[tuple[TrainerKey, refusals.Measurement]] = field(default_factory=set)  # logged, each once

    def notice_heard(self) -> bool:
        """A controller has answered a call that carried the pending notice: it acts on it, not the agent."""
        return self.notice is not None and self.heard == self.notice.event_id
