"""The composition of the daemon: documented settings, one controller per state directory, real wiring."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from controller.app.daemon import Controller, grpc_options
from controller.app.settings import ControllerSettings, LocalSettings, SchedulerSettings
from controller.app.state_lock import LOCK_FILE, StateDirInUse
from morphing.errors import UserInputError
from spotmorph.commands.controller import PROVIDERS
from spotmorph.local.provider import LocalProcessProvider
from tests.controller.helpers import REPO, served_address

DOCS = REPO / "docs" / "controller.md"


@pytest.mark.parametrize(
    ("model", "prefix"), [(ControllerSettings, ""), (LocalSettings, "local."), (SchedulerSettings, "scheduler.")]
)
def test_every_setting_is_described_and_in_the_docs(model: type[BaseModel], prefix: str) -> None:
    docs = DOCS.read_text()
    for name, field in model.model_fields.items():
        assert field.description, f"{model.__name__}.{name} has no docstring"
        assert f"`{prefix}{name}`" in docs, f"docs/controller.md does not mention the setting `{prefix}{name}`"


def test_grpc_options_come_from_settings() -> None:
    options = dict(grpc_options(ControllerSettings(max_receive_message_bytes=2048, keepalive_time_seconds=1.5)))
    assert options["grpc.max_receive_message_length"] == 2048
    assert options["grpc.keepalive_time_ms"] == 1500
    assert options["grpc.max_send_message_length"] == 16 << 20


def test_one_controller_per_state_dir_in_one_process_and_the_lock_goes_with_it(tmp_path: Path) -> None:
    async def main() -> None:
        settings = ControllerSettings(state_dir=tmp_path / "state", listen="127.0.0.1:0")
        first = Controller(settings)
        with pytest.raises(StateDirInUse, match=f"pid {os.getpid()}"):
            Controller(settings)
        await first.stop(grace=0)
        with pytest.raises(UserInputError, match="needs TLS"):  # a failed start does not keep the lock
            Controller(settings.model_copy(update={"listen": "10.1.2.3:0"}))
        second = Controller(settings)
        await second.stop(grace=0)

    asyncio.run(main())


def test_the_local_provider_gives_agents_the_bound_address(tmp_path: Path) -> None:
    async def main() -> None:
        settings = ControllerSettings(state_dir=tmp_path / "state", listen="127.0.0.1:0", provider="local")
        controller = Controller(settings, providers=PROVIDERS)
        provider = controller.runner.provider
        assert isinstance(provider, LocalProcessProvider)
        assert provider.controller == f"127.0.0.1:{controller.port}" and controller.port != 0
        await controller.stop(grace=0)

    asyncio.run(main())


def _command(state: Path) -> list[str]:
    return [sys.executable, "-m", "spotmorph.cli", "controller", "--state-dir", str(state), "--listen", "127.0.0.1:0"]


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def _start(state: Path, log: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A real controller, returned once it wrote its address (it serves from then on)."""
    with log.open("ab") as out:
        process = subprocess.Popen(_command(state), stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    started.append(process)
    served_address(process, state, log)
    return process


@pytest.mark.slow
def test_a_second_controller_on_the_same_state_dir_exits_2_naming_the_first(
    tmp_path: Path, daemons: list[subprocess.Popen[bytes]]
) -> None:
    state = tmp_path / "state"
    first = _start(state, tmp_path / "first.log", daemons)
    assert (state / LOCK_FILE).read_text().strip() == str(first.pid)
    second = subprocess.run(_command(state), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert second.returncode == 2, second.stderr
    [line] = second.stderr.strip().splitlines()
    assert str(state) in line and f"pid {first.pid}" in line, line
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    (state / "controller.addr").unlink()
    third = _start(state, tmp_path / "third.log", daemons)  # the lock left with the first
    third.send_signal(signal.SIGTERM)
    assert third.wait(30) == 0
