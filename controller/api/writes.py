"""What the API may change, all of it through the runner (persisted before any reply goes out)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from controller.core.model import Command, JobRecord, NodeObservation, World
from controller.core.stimulus import Stimulus
from morphing.jobspec import JobSpec


class Writes(Protocol):
    """The runner's write methods; the servicers read through :class:`controller.shell.views.StateView`."""

    async def submit(self, spec: JobSpec, key: str | None = None) -> JobRecord: ...

    async def cancel(self, job_id: str, who: str) -> JobRecord: ...

    async def decide(self, make: Callable[[World, float], list[Command]], stimulus: Stimulus | None = None) -> None: ...

    async def observe(self, name: str, seen: NodeObservation, rpc: str = "Heartbeat") -> None: ...
