"""A controller address nothing answers at: every client command says so in one line naming the fix, exits 5
(controller unreachable) within a few seconds, and ``spotmorph submit`` asks before building the model."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.client import connection
from controller.client.commands.common import EXIT_UNAVAILABLE
from controller.client.context import Context, write_context
from morphing.jobspec import JobSpec
from spotmorph.cli import main
from spotmorph.commands import submit
from tests.cli.test_submit_input import EXAMPLE
from tests.controller.test_tls import TlsServer, server

__all__ = ["server"]  # the TLS controller fixture

COMMANDS = [
    ["jobs"],
    ["nodes"],
    ["events"],
    ["status", "job-1"],
    ["cancel", "job-1"],
    ["logs", "job-1"],
    ["timeline", "job-1", "--out", "t.html"],
    ["submit", str(EXAMPLE)],
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that takes connections and never answers: as a VM whose firewall drops the port, gRPC's own
    connect timeout (20 s) would pass before a call failed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(0)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def one_line_naming_the_fix(err: str, command: str, address: str) -> None:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"spotmorph {command}: no controller answers at {address} (from --controller)"), err
    for fix in ("`spotmorph controller`", "`spotmorph local up`", "--controller HOST:PORT", "SPOTMORPH_CONTROLLER"):
        assert fix in err, (fix, err)


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_nothing_listening_is_one_line_and_exit_5(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    skip = ["--skip-model-check"] if command[0] == "submit" else []  # not this test's model: no torch import
    code = main([*command, "--controller", address, "--token", "t", *skip])
    assert time.monotonic() - started < 30  # a hang guard: the refusal itself comes at once
    out, err = capsys.readouterr()
    assert code == EXIT_UNAVAILABLE and out == "", err
    one_line_naming_the_fix(err, command[0], address)
    assert "the connection failed" in err


@pytest.mark.slow
def test_an_address_that_never_answers_gives_up_at_the_deadline(
    capsys: pytest.CaptureFixture[str], silent: str
) -> None:
    assert connection.READY_SECONDS == 5.0
    started = time.monotonic()
    code = main(["jobs", "--controller", silent, "--token", "t"])
    assert time.monotonic() - started < 15  # gRPC alone would wait its 20 s connect timeout
    err = capsys.readouterr().err
    assert code == EXIT_UNAVAILABLE
    one_line_naming_the_fix(err, "jobs", silent)
    assert f"{silent} (from --controller) within 5 s:" in err


def test_the_wait_has_the_deadline_and_says_where_the_address_came_from(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, silent: str
) -> None:
    monkeypatch.setattr(connection, "READY_SECONDS", 0.2)
    monkeypatch.setenv("SPOTMORPH_CONTROLLER", silent)
    monkeypatch.setenv("SPOTMORPH_HOME", str(tmp_path))
    assert main(["nodes", "--token", "t"]) == EXIT_UNAVAILABLE
    assert f"at {silent} (from SPOTMORPH_CONTROLLER) within 0.2 s:" in capsys.readouterr().err
    monkeypatch.delenv("SPOTMORPH_CONTROLLER")
    write_context(Context(controller=silent, token_file=""), tmp_path)
    assert main(["nodes"]) == EXIT_UNAVAILABLE
    assert f"(from the context file {tmp_path / 'context.json'} that `spotmorph local up` wrote)" in (
        capsys.readouterr().err
    )


def test_submit_asks_the_controller_before_building_the_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []

    def model_layers(spec: JobSpec) -> tuple[str, ...]:
        built.append(spec.name)
        return ()

    monkeypatch.setattr(submit, "model_layers", model_layers)
    address = f"127.0.0.1:{free_port()}"
    assert main(["submit", str(EXAMPLE), "--controller", address, "--token", "t"]) == EXIT_UNAVAILABLE
    one_line_naming_the_fix(capsys.readouterr().err, "submit", address)
    assert built == []  # the minutes a large model takes to build are not spent on a wrong address


def test_over_tls_the_check_passes_and_a_plaintext_client_is_told_why(
    capsys: pytest.CaptureFixture[str], server: TlsServer
) -> None:
    c = server.certs
    tls = ["--tls-ca", str(c / "ca.crt"), "--tls-cert", str(c / "operator.crt"), "--tls-key", str(c / "operator.key")]
    assert main(["jobs", "--controller", server.address, "--token", server.token, *tls]) == 0
    capsys.readouterr()
    assert main(["jobs", "--controller", server.address, "--token", server.token]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    one_line_naming_the_fix(err, "jobs", server.address)
    assert "its TLS and --tls-ca do not match" in err


def test_a_refusal_is_an_answer_reported_as_before(capsys: pytest.CaptureFixture[str], server: TlsServer) -> None:
    """The health check needs no token: a wrong one is the command's own call's refusal (exit 4)."""
    c = server.certs
    tls = ["--tls-ca", str(c / "ca.crt"), "--tls-cert", str(c / "operator.crt"), "--tls-key", str(c / "operator.key")]
    assert main(["jobs", "--controller", server.address, "--token", "not-a-token", *tls]) == 4
    assert "UNAUTHENTICATED" in capsys.readouterr().err
