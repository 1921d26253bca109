"""A real ``spotmorph controller`` refuses a bad configuration: exit 2, one line naming the problem, no trace.

TLS flags come in pairs, their files must be readable PEM and the key must be the certificate's; metrics
beyond loopback need TLS (then HTTPS) or ``--metrics-allow-remote``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from controller.app import daemon
from controller.app.daemon import Controller
from controller.app.settings import ControllerSettings
from controller.client.certs import make_cluster_certs
from morphing.errors import UserInputError
from tests import forkserver_client
from tests.controller.helpers import REPO


def controller(state: Path, *flags: str) -> list[str]:
    command = [sys.executable, "-m", "spotmorph.cli", "controller", "--state-dir", str(state)]
    return [*command, "--listen", "127.0.0.1:0", *flags]


def refused(state: Path, *flags: str) -> str:
    """The one line a refused start printed; the state directory was never created. Forked from the worker's fork
    server (its imports done: a refused start is the command's own behaviour, not the interpreter's)."""
    command = controller(state, *flags)
    if forkserver_client.enabled():
        code, out, err = forkserver_client.run(command[1:], REPO, 60)
    else:
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)
        code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 2, f"exit {code}:\n{out}{err}"
    [line] = err.strip().splitlines()
    assert line.startswith("spotmorph controller: error: "), line
    assert not state.exists(), "a refused start left the state directory behind"
    return line


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_cluster_certs(folder / "a", ["127.0.0.1"], ["operator"])
    make_cluster_certs(folder / "b", ["127.0.0.1"], [])
    (folder / "a" / "server.der").write_bytes(ssl.PEM_cert_to_DER_cert((folder / "a" / "server.crt").read_text()))
    (folder / "notes.txt").write_text("not a key\n")
    return folder


# (flags with {a}/{b} for the two cluster folders, what the one line must name)
BAD_TLS: dict[str, tuple[list[str], list[str]]] = {
    "cert without key": (["--tls-cert", "{a}/server.crt"], ["--tls-cert", "without --tls-key", "pass --tls-key"]),
    "cert and CA without key (served plaintext)": (
        ["--tls-cert", "{a}/server.crt", "--tls-ca", "{a}/ca.crt"],
        ["without --tls-key", "pass --tls-key"],
    ),
    "key without cert": (["--tls-key", "{a}/server.key"], ["--tls-key", "without --tls-cert", "pass --tls-cert"]),
    "CA alone": (["--tls-ca", "{a}/ca.crt"], ["--tls-ca", "without --tls-cert and --tls-key"]),
    "missing cert file": (
        ["--tls-cert", "{a}/missing.crt", "--tls-key", "{a}/server.key"],
        ["--tls-cert {a}/missing.crt", "No such file"],
    ),
    "missing key file": (
        ["--tls-cert", "{a}/server.crt", "--tls-key", "{a}/missing.key"],
        ["--tls-key {a}/missing.key", "No such file"],
    ),
    "unreadable CA (a directory)": (
        ["--tls-cert", "{a}/server.crt", "--tls-key", "{a}/server.key", "--tls-ca", "{a}"],
        ["--tls-ca {a}", "not a regular file (a directory)"],
    ),
    "key of another certificate": (
        ["--tls-cert", "{a}/server.crt", "--tls-key", "{b}/server.key"],
        ["--tls-key {b}/server.key does not belong to --tls-cert {a}/server.crt"],
    ),
    "DER certificate": (
        ["--tls-cert", "{a}/server.der", "--tls-key", "{a}/server.key"],
        ["--tls-cert {a}/server.der", "not a PEM certificate", "openssl x509 -inform der"],
    ),
    "CA that is not a certificate": (
        ["--tls-cert", "{a}/server.crt", "--tls-key", "{a}/server.key", "--tls-ca", "{a}/ca.key"],
        ["--tls-ca {a}/ca.key", "not a PEM certificate"],
    ),
    "key that is not a key": (
        ["--tls-cert", "{a}/server.crt", "--tls-key", "{root}/notes.txt"],
        ["--tls-key {root}/notes.txt", "not a PEM private key"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_TLS))
def test_a_bad_tls_setting_exits_2_with_one_line_before_creating_anything(
    case: str, certs: Path, tmp_path: Path
) -> None:
    flags, expected = BAD_TLS[case]

    def fill(text: str) -> str:
        return text.format(a=certs / "a", b=certs / "b", root=certs)

    line = refused(tmp_path / "state", *map(fill, flags))
    for fragment in map(fill, expected):
        assert fragment in line, line


def test_metrics_beyond_loopback_without_tls_exit_2_naming_the_fix(tmp_path: Path) -> None:
    line = refused(tmp_path / "state", "--metrics-listen", "0.0.0.0:0")
    assert "--metrics-listen 0.0.0.0:0" in line and "--metrics-allow-remote" in line and "TLS" in line, line


def test_an_invalid_config_file_exits_2_naming_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text("tls_crt: /etc/spotmorph/server.crt\n")
    line = refused(tmp_path / "state", "--config", str(config))
    assert "tls_crt" in line and "Extra inputs are not permitted" in line, line


def wait_for(path: Path, process: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert process.poll() is None, f"the controller exited {process.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {path.name} after 60 s:\n{log.read_text()}"
        time.sleep(0.05)
    return path.read_text().strip()


@pytest.mark.slow
def test_metrics_beyond_loopback_are_served_with_metrics_allow_remote(tmp_path: Path) -> None:
    state, log = tmp_path / "state", tmp_path / "controller.log"
    command = controller(state, "--metrics-listen", "0.0.0.0:0", "--metrics-allow-remote")
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        address = wait_for(state / "metrics.addr", process, log)
        assert address.startswith("0.0.0.0:")
        port = address.rsplit(":", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert b"spotmorph_nodes" in reply.read()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()


def test_with_tls_metrics_are_https_for_clients_of_the_cluster_ca(certs: Path, tmp_path: Path) -> None:
    a = certs / "a"
    settings = ControllerSettings(
        state_dir=tmp_path / "state",
        listen="127.0.0.1:0",
        tls_cert=a / "server.crt",
        tls_key=a / "server.key",
        tls_ca=a / "ca.crt",
        metrics_listen="0.0.0.0:0",
    )

    def fetch(url: str, context: ssl.SSLContext | None = None) -> bytes:
        with urllib.request.urlopen(url, timeout=10, context=context) as reply:
            body: bytes = reply.read()
            return body

    async def main() -> None:
        server = Controller(settings)
        await server.start()
        try:
            url = f"127.0.0.1:{server.metrics_port}/metrics"
            client = ssl.create_default_context(cafile=a / "ca.crt")
            client.load_cert_chain(a / "operator.crt", a / "operator.key")
            assert b"spotmorph_nodes" in await asyncio.to_thread(fetch, f"https://{url}", client)
            anonymous = ssl.create_default_context(cafile=a / "ca.crt")
            for attempt in (lambda: fetch(f"https://{url}", anonymous), lambda: fetch(f"http://{url}")):
                with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
                    await asyncio.to_thread(attempt)
        finally:
            await server.stop(grace=0)

    asyncio.run(main())


def test_a_refused_start_leaves_the_state_dir_free_for_the_next(certs: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    bad = ControllerSettings(
        state_dir=state, listen="127.0.0.1:0", tls_cert=certs / "a" / "server.crt", tls_key=certs / "b" / "server.key"
    )

    async def main() -> None:
        with pytest.raises(UserInputError, match="does not belong to"):
            Controller(bad)
        good = Controller(bad.model_copy(update={"tls_key": certs / "a" / "server.key"}))
        await good.stop(grace=0)

    asyncio.run(main())


def test_sigterm_once_the_address_is_written_stops_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """``start`` writes controller.addr; a supervisor that sees it may stop the controller at once."""
    stopped: list[bool] = []

    class Started:
        port = 1

        def __init__(self, _settings: ControllerSettings, **_wiring: object) -> None: ...

        async def start(self) -> None:
            handler = signal.getsignal(signal.SIGTERM)
            assert handler not in (signal.SIG_DFL, None), "a SIGTERM now would kill the controller uncleanly"
            os.kill(os.getpid(), signal.SIGTERM)

        async def stop(self) -> None:
            stopped.append(True)

    monkeypatch.setattr(daemon, "Controller", Started)
    assert asyncio.run(daemon.serve(ControllerSettings())) == 0
    assert stopped == [True]
