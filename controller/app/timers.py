"""When things happen: the controller's periodic timers on APScheduler's AsyncIOScheduler (3.x).

Timers only wake the controller up; what happens is decided by the pure reconcile, which compares
stored times with the injected clock. So a missed or late tick never changes a decision, only its
latency, and tests call the same callbacks directly instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler

Tick = Callable[[], Awaitable[None]]

# Fixed ids, so a restart (or a second start) replaces rather than duplicates a timer.
HEARTBEAT_EXPIRY = "heartbeat-expiry"
DEBOUNCE = "arrival-debounce"
CHECKPOINT_REQUESTS = "checkpoint-requests"
PROVIDER_POLL = "provider-poll"


@dataclass(frozen=True)
class TimerConfig:
    expiry_check_seconds: float = 1.0  # also picks up step progress (persisted at most this often)
    debounce_check_seconds: float = 1.0
    checkpoint_request_seconds: float = 0.0  # 0: off; trainers checkpoint every N steps anyway
    provider_poll_seconds: float = 0.0  # 0: off


class Timers:
    def __init__(self, config: TimerConfig) -> None:
        self.config = config
        defaults = {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        self.scheduler = AsyncIOScheduler(job_defaults=defaults)

    def start(self, *, expiry: Tick, debounce: Tick, checkpoints: Tick, poll: Tick) -> None:
        """Register the timers (in-memory job store, fixed ids) and start; call from a running loop."""
        plan = (
            (HEARTBEAT_EXPIRY, expiry, self.config.expiry_check_seconds),
            (DEBOUNCE, debounce, self.config.debounce_check_seconds),
            (CHECKPOINT_REQUESTS, checkpoints, self.config.checkpoint_request_seconds),
            (PROVIDER_POLL, poll, self.config.provider_poll_seconds),
        )
        for job_id, func, seconds in plan:
            if seconds > 0:
                self.scheduler.add_job(func, "interval", seconds=seconds, id=job_id, replace_existing=True)
        self.scheduler.start()

    def poll_soon(self) -> None:
        """Run the provider poll now rather than at its next interval (a VM registered: its pool is known from the
        provider's list, before arrivals settle). A poll under way is not doubled (one instance at a time)."""
        job = self.scheduler.get_job(PROVIDER_POLL) if self.scheduler.running else None
        if job is not None:
            job.modify(next_run_time=datetime.now(job.trigger.timezone))

    def ids(self) -> list[str]:
        return sorted(job.id for job in self.scheduler.get_jobs())

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
