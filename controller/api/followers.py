"""Bounds on ``WatchLogs --follow`` streams: each holds a task and wakes on every new line of its job.

A thousand of them once made another node's heartbeats wait (p99 2.5 s). A follow stream is admitted while
its caller (its bearer token) has fewer than ``per_caller`` and the controller fewer than ``total``; beyond
that the call is RESOURCE_EXHAUSTED, naming the bound. Non-follow reads end by themselves and are not counted.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import Iterator

from controller.core.intake import Full

MAX_FOLLOWERS_PER_CALLER = 32  # the defaults of the settings max_log_followers_per_caller and max_log_followers
MAX_FOLLOWERS = 256


class Followers:
    def __init__(self, per_caller: int = MAX_FOLLOWERS_PER_CALLER, total: int = MAX_FOLLOWERS) -> None:
        self.per_caller, self.total = per_caller, total
        self._by_caller: Counter[str] = Counter()

    @property
    def active(self) -> int:
        return sum(self._by_caller.values())

    @contextlib.contextmanager
    def admitted(self, token: str | None) -> Iterator[None]:
        """Hold one follow stream of ``token``'s caller for the block; :class:`Full` when a bound is reached."""
        caller = hashlib.sha256((token or "").encode()).hexdigest()  # not the token itself
        if self._by_caller[caller] >= self.per_caller:
            raise Full(
                f"follow: this caller already follows {self._by_caller[caller]} log streams, the most one may "
                f"({self.per_caller}); end one, or read without --follow"
            )
        if self.active >= self.total:
            raise Full(f"follow: the controller serves {self.active} log streams, the most it may; try again later")
        self._by_caller[caller] += 1
        try:
            yield
        finally:
            self._by_caller[caller] -= 1
            if self._by_caller[caller] <= 0:
                del self._by_caller[caller]
