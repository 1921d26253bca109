"""Secrets stay private whatever the umask: a real ``spotmorph controller`` and ``spotmorph certs`` under 000 and 022.

The state directory and the certificate folder are 0700; the database (and its -wal/-shm), tokens,
node secret and private keys 0600; certificates and address files 0644. A looser state directory or
database left by an older version is tightened, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.app.daemon import Controller
from controller.app.settings import ControllerSettings
from controller.client.certs import make_cluster_certs
from controller.files import write_private, write_public
from tests.controller.helpers import REPO

SPOTMORPH = [sys.executable, "-m", "spotmorph.cli"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes(folder: Path, names: list[str]) -> dict[str, int]:
    return {name: mode(folder / name) for name in names}


def run_controller(state: Path, umask: int, log: Path) -> None:
    """Start a real controller under ``umask``, check the modes while it runs, stop it with SIGTERM."""
    command = [*SPOTMORPH, "controller", "--state-dir", str(state), "--listen", "127.0.0.1:0"]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*command, "--metrics-listen", "127.0.0.1:0"], stdout=out, stderr=subprocess.STDOUT, cwd=REPO, umask=umask
        )
    try:
        deadline = time.monotonic() + 60
        while not (state / "metrics.addr").exists():
            assert process.poll() is None, f"the controller exited {process.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no metrics.addr after 60 s:\n{log.read_text()}"
            time.sleep(0.05)
        private = ["operator.token", "reader.token", "node-secret", "state.db"]
        private += ["state.db-wal", "state.db-shm"]
        assert mode(state) == 0o700
        assert modes(state, private) == dict.fromkeys(private, 0o600)
        assert modes(state, ["controller.addr", "metrics.addr"]) == dict.fromkeys(
            ["controller.addr", "metrics.addr"], 0o644
        )
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_the_controller_keeps_its_state_private_under_any_umask(tmp_path: Path, umask: int) -> None:
    run_controller(tmp_path / "state", umask, tmp_path / "controller.log")


@pytest.mark.parametrize("umask", [0o000, 0o022], ids=["umask000", "umask022"])
def test_spotmorph_certs_writes_private_keys_and_public_certificates_under_any_umask(
    tmp_path: Path, umask: int
) -> None:
    out = tmp_path / "certs"
    command = [*SPOTMORPH, "certs", str(out), "--client", "operator"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60, umask=umask)
    assert done.returncode == 0, done.stderr
    assert mode(out) == 0o700
    keys = ["ca.key", "server.key", "operator.key"]
    certificates = ["ca.crt", "server.crt", "operator.crt"]
    assert modes(out, keys) == dict.fromkeys(keys, 0o600)
    assert modes(out, certificates) == dict.fromkeys(certificates, 0o644)
    assert sorted(p.name for p in out.iterdir()) == sorted(keys + certificates)  # no temporary files left


def test_certificates_made_again_into_a_loose_folder_come_out_private(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    out.mkdir()
    for name in ("server.key", "ca.key"):
        (out / name).write_text("old")
        os.chmod(out / name, 0o666)
    os.chmod(out, 0o777)
    make_cluster_certs(out, ["127.0.0.1"], ["client"])
    assert mode(out) == 0o700
    assert modes(out, ["server.key", "ca.key", "client.key"]) == dict.fromkeys(
        ["server.key", "ca.key", "client.key"], 0o600
    )


def test_a_loose_state_dir_and_database_are_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.db").touch()
    os.chmod(state / "state.db", 0o644)
    os.chmod(state, 0o777)

    async def main() -> None:
        controller = Controller(ControllerSettings(state_dir=state, listen="127.0.0.1:0"))
        await controller.stop(grace=0)

    with caplog.at_level(logging.WARNING, logger="spotmorph.files"):
        asyncio.run(main())
    assert mode(state) == 0o700
    assert mode(state / "state.db") == 0o600
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert f"{state} was mode 777" in warned and f"{state / 'state.db'} was mode 644" in warned


def test_writes_set_the_mode_whatever_the_umask_and_the_file_had(tmp_path: Path) -> None:
    secret, public = tmp_path / "secret", tmp_path / "public"
    for path in (secret, public):
        path.write_text("old")
        os.chmod(path, 0o666)
    previous = os.umask(0o077)
    try:
        write_private(secret, b"new secret")
        write_public(public, b"new address")
    finally:
        os.umask(previous)
    assert (mode(secret), secret.read_bytes()) == (0o600, b"new secret")
    assert (mode(public), public.read_bytes()) == (0o644, b"new address")
