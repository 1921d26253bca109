"""A rank that is told its assignment before the generation's host rank connects to the store as soon as the
host listens (torch's client would back off 0.2-0.6 s after a refused connect), and says which address it
waited for when nothing ever listens."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from worker_agent.runtime.process.trainer_setup import POLL_SECONDS, wait_listening


@pytest.fixture
def bound() -> Iterator[socket.socket]:
    """A port of this machine that refuses connections until the test calls ``listen()``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock
    finally:
        sock.close()


def test_returns_at_once_when_the_store_listens(bound: socket.socket) -> None:
    bound.listen()
    pauses: list[float] = []
    wait_listening("127.0.0.1", bound.getsockname()[1], deadline=0.0, pause=pauses.append, clock=lambda: 1.0)
    assert pauses == []


def test_connects_on_the_first_try_after_the_host_starts_listening(bound: socket.socket) -> None:
    pauses: list[float] = []

    def host_starts(seconds: float) -> None:  # the host rank starts its store while this rank pauses
        pauses.append(seconds)
        bound.listen()

    wait_listening("127.0.0.1", bound.getsockname()[1], deadline=10.0, pause=host_starts, clock=lambda: 0.0)
    assert pauses == [POLL_SECONDS]


def test_keeps_trying_until_the_deadline_then_names_the_address(bound: socket.socket) -> None:
    now = iter([0.0, 0.5, 1.0, 1.5])
    pauses: list[float] = []
    port = bound.getsockname()[1]
    with pytest.raises(TimeoutError) as caught:
        wait_listening("127.0.0.1", port, deadline=1.5, pause=pauses.append, clock=lambda: next(now))
    assert len(pauses) == 3
    assert f"nothing listens on 127.0.0.1:{port}" in str(caught.value)
    assert "rank 0 hosts the store" in str(caught.value)


def test_gives_up_at_once_when_the_generation_is_abandoned(bound: socket.socket) -> None:
    """Its agent aborted the generation (a peer never came): no waiting out the deadline for a store never to come."""
    told = iter([False, False, True])
    pauses: list[float] = []
    with pytest.raises(TimeoutError, match="the generation was aborted"):
        wait_listening(
            "127.0.0.1",
            bound.getsockname()[1],
            deadline=1e9,
            pause=pauses.append,
            clock=lambda: 0.0,
            abandoned=lambda: next(told),
        )
    assert len(pauses) == 2
