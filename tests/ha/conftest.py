"""The HA tests' controller processes (tests/ha/daemons.py), ended after each test."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.ha.daemons import Daemon


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """The controllers a test starts (:func:`tests.ha.daemons.start` adds each): killed by pid, and a paused one
    (SIGSTOP) resumed first, once the test ends. Only these: under ``ip netns exec`` the pid is the controller's."""
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for daemon in started:
            if daemon.process.poll() is None:
                os.kill(daemon.process.pid, signal.SIGCONT)
                daemon.process.kill()
            daemon.process.wait(10)
        assert all(d.process.poll() is not None for d in started)
