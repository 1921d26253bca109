"""Azure's Scheduled Events (:mod:`worker_agent.scheduled_events`) as a notice source like the others.

Azure documents a Spot eviction-risk signal only as a preview ("Spot rebalance recommendation", Spot Plus, after
registering the ``Microsoft.Compute/SpotPlus`` feature): a Scheduled Event at the same endpoint under another
``api-version``, neither of which, nor its ``EventType``, the documentation names. This source reads none rather
than guess at them (docs/runtime.md): on Azure the agent reports notices, never a risk.
"""

from __future__ import annotations

from collections.abc import Callable

from worker_agent.notices.facts import Polled
from worker_agent.scheduled_events import EvictionPoller, EvictionWatcher, ScheduledEventsClient


class AzureNoticeSource:
    """Polls Scheduled Events every ``poll_seconds`` for this VM's evictions (:class:`~.facts.NoticeSource`)."""

    def __init__(self, base_url: str, vm_name: Callable[[], str], poll_seconds: float = 1.0) -> None:
        self.vm_name = vm_name  # the VM's name in the events' Resources: known once the node registered
        self.poll_seconds = poll_seconds
        self.watcher = EvictionWatcher(vm_name())
        self.poller = EvictionPoller(ScheduledEventsClient(base_url), self.watcher)

    def poll(self) -> Polled:
        if not self.watcher.vm_name:
            self.watcher.vm_name = self.vm_name()
        return Polled(tuple(self.poller.poll()), self.poll_seconds)
