"""A real controller on loopback (in a thread with its own event loop), authenticated stubs, metrics."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.app.daemon import Controller
from controller.app.settings import ControllerSettings
from controller.client import connection as client
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from tests.controller.helpers import FakeClock, write_profile


@dataclass
class Live:
    controller: Controller
    loop: asyncio.AbstractEventLoop
    address: str
    state_dir: Path
    profile: Path
    clock: FakeClock | None = None  # the controller's time, when a test moves it

    def token(self, role: str) -> str:
        return (self.state_dir / f"{role}.token").read_text().strip()

    def agent_token(self, instance: str = "vm-test") -> str:
        """The per-VM agent token the controller issues to ``instance``."""
        return self.controller.tokens.vm_token(instance)

    def channel(self, token: str | None) -> grpc.Channel:
        return client.channel(self.address, token)

    def jobs(self, role: str = "operator") -> rpc.JobsStub:
        return rpc.JobsStub(self.channel(self.token(role)))

    def cluster(self, role: str = "operator") -> rpc.ClusterStub:
        return rpc.ClusterStub(self.channel(self.token(role)))

    def agent(self, token: str) -> rpc.AgentStub:
        return rpc.AgentStub(self.channel(token))

    def scrape(self) -> str:
        """The Prometheus text the controller serves at ``/metrics``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.controller.metrics_port}/metrics", timeout=10) as got:
            return str(got.read().decode())

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def event_log(self) -> str:
        rows = self.controller.store.events(limit=10_000)
        return "\n".join(f"{r.seq} {r.at:.3f} {r.kind} job={r.job} node={r.node} {r.data}" for r in rows)


@contextmanager
def running(tmp_path: Path, clock: FakeClock | None = None, **overrides: Any) -> Iterator[Live]:
    """A controller serving on loopback until the block ends (``clock``: its time, moved by the test)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fields: dict[str, Any] = {
        "state_dir": tmp_path / "state",
        "listen": "127.0.0.1:0",
        "metrics_listen": "127.0.0.1:0",
        "debounce_seconds": 0.0,
        "heartbeat_expiry_seconds": 5.0,
    }
    settings = ControllerSettings(**{**fields, **overrides})

    async def make() -> Controller:
        controller = Controller(settings, clock)
        await controller.start()
        return controller

    controller = asyncio.run_coroutine_threadsafe(make(), loop).result(30)
    address = f"127.0.0.1:{controller.port}"
    state = Live(controller, loop, address, settings.state_dir, write_profile(tmp_path), clock)
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(controller.stop(grace=0.5), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with running(tmp_path) as state:
        yield state


@pytest.fixture
def live_clock(tmp_path: Path) -> Iterator[Live]:
    """A live controller whose time moves only when the test moves ``live.clock``."""
    with running(tmp_path, FakeClock(1_000_000.0)) as state:
        yield state
