"""What a cloud's notice source tells the agent, and the interface every source has.

The agent's eviction side (:mod:`worker_agent.agent.evictions`) knows these facts only, so a notice from AWS or GCP
is handled exactly as one from Azure: the trainers hand off or hold their step, whoever announced the eviction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

Cloud = Literal["azure", "aws", "gcp"]
CLOUDS: tuple[Cloud, ...] = ("azure", "aws", "gcp")
AZURE_SOURCE = "azure-scheduled-events"


@dataclass(frozen=True)
class EvictionNoticed:
    """An eviction of this VM was announced (or its status changed, e.g. to ``Started``)."""

    event_id: str
    event_type: str
    status: str
    not_before: datetime | None
    source: str = AZURE_SOURCE  # what the controller is told announced it


@dataclass(frozen=True)
class EvictionWithdrawn:
    """An announced eviction no longer stands: it left the document or its status is no longer active."""

    event_id: str
    reason: str


@dataclass(frozen=True)
class EvictionRiskNoticed:
    """The cloud warns that this VM is at elevated risk of eviction, before any notice (AWS's rebalance
    recommendation): the controller grows nothing onto it and moves its job off when it can."""

    source: str
    noticed_at: float  # unix seconds when the agent first saw it
    detail: str = ""  # what the cloud said, for the log


@dataclass(frozen=True)
class EvictionRiskWithdrawn:
    source: str
    reason: str


Fact = EvictionNoticed | EvictionWithdrawn
AnyFact = EvictionNoticed | EvictionWithdrawn | EvictionRiskNoticed | EvictionRiskWithdrawn


@dataclass(frozen=True)
class Polled:
    """One look's facts, and how long to wait before the next (a hanging GET that returned looks again at once)."""

    facts: tuple[AnyFact, ...]
    wait: float


class NoticeSource(Protocol):
    """A cloud's notices: one blocking look at its metadata service that never raises (run it in a thread)."""

    def poll(self) -> Polled: ...


class Problems:
    """Logs each new set of problems as warnings and its repeats (one a poll) at debug level, so a metadata
    service that keeps answering badly says so once."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.last: tuple[str, ...] = ()

    def say(self, problems: tuple[str, ...]) -> None:
        level = logging.DEBUG if problems == self.last else logging.WARNING
        for problem in problems:
            self.logger.log(level, "%s: %s", self.what, problem)
        self.last = problems

    def unexpected(self, exc: Exception) -> None:
        """A bug in a source must not end eviction watching for good: logged, and the next poll goes on."""
        self.logger.warning("%s: unexpected %s", self.what, type(exc).__name__, exc_info=True)
        self.last = ()
