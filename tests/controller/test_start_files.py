"""Files named by a flag are read as small regular files: /dev/zero, a FIFO or a huge file is one line, exit 2.

Before, ``--tls-cert /dev/zero`` grew the controller by gigabytes until a MemoryError traceback, and a
FIFO without a writer blocked its start forever. The children run with their address space capped, so
a regression fails fast instead of filling the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.client.certs import make_cluster_certs
from controller.files import read_small
from morphing.errors import UserInputError
from tests.controller.helpers import REPO

ADDRESS_SPACE = 8 << 30  # ample for a controller and gRPC's threads; a reader of /dev/zero hits it in seconds


def spotmorph(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command with its address space capped by prlimit(1): no Python runs between fork and exec (a
    ``preexec_fn`` would, in a test process whose earlier tests left gRPC threads running)."""
    command = ["prlimit", f"--as={ADDRESS_SPACE}", "--", sys.executable, "-m", "spotmorph.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60, env=env, check=False)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stdout}{done.stderr}"
    [line] = done.stderr.strip().splitlines()
    assert "Traceback" not in line, line
    return line


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("files")
    make_cluster_certs(folder, ["127.0.0.1"], ["operator"])
    os.mkfifo(folder / "fifo")  # nobody ever writes to it: an open without O_NONBLOCK would wait forever
    with open(folder / "huge.pem", "wb") as handle:  # sparse: 8 MiB of zeros that take no disk
        handle.truncate(8 << 20)
    return folder


# (flags, with {f} for the files folder; the flag the line must name)
HOSTILE = {
    "cert is /dev/zero": (["--tls-cert", "/dev/zero", "--tls-key", "{f}/server.key"], "--tls-cert /dev/zero"),
    "key is /dev/zero": (["--tls-cert", "{f}/server.crt", "--tls-key", "/dev/zero"], "--tls-key /dev/zero"),
    "CA is /dev/zero": (
        ["--tls-cert", "{f}/server.crt", "--tls-key", "{f}/server.key", "--tls-ca", "/dev/zero"],
        "--tls-ca /dev/zero",
    ),
    "cert is a FIFO": (["--tls-cert", "{f}/fifo", "--tls-key", "{f}/server.key"], "--tls-cert {f}/fifo"),
    "cert is huge": (["--tls-cert", "{f}/huge.pem", "--tls-key", "{f}/server.key"], "--tls-cert {f}/huge.pem"),
    "config is /dev/zero": (["--config", "/dev/zero"], "--config /dev/zero"),
    "config is a FIFO": (["--config", "{f}/fifo"], "--config {f}/fifo"),
    "token file is /dev/zero": (["--token-file", "/dev/zero"], "--token-file /dev/zero"),
    "token file is a FIFO": (["--token-file", "{f}/fifo"], "--token-file {f}/fifo"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_file_flag_stops_the_controller_with_one_line_naming_it(
    case: str, files: Path, tmp_path: Path
) -> None:
    flags, named = HOSTILE[case]
    filled = [flag.format(f=files) for flag in flags]
    state = tmp_path / "state"
    line = one_line(spotmorph("controller", "--state-dir", str(state), "--listen", "127.0.0.1:0", *filled))
    assert named.format(f=files) in line, line
    assert "regular file" in line or "larger than" in line, line
    assert not (state / "state.db").exists(), "a refused start opened the store"


def test_the_client_refuses_a_hostile_tls_file_with_one_line(files: Path) -> None:
    flags = ("--controller", "127.0.0.1:1", "--tls-ca", str(files / "ca.crt"), "--tls-key", "/dev/zero")
    line = one_line(spotmorph("jobs", *flags))
    assert "--tls-key /dev/zero: not a regular file (a character device)" in line, line


def test_the_client_refuses_a_context_whose_token_file_is_a_fifo(files: Path, tmp_path: Path) -> None:
    context = {"controller": "127.0.0.1:1", "token_file": str(files / "fifo")}
    (tmp_path / "context.json").write_text(json.dumps(context))
    line = one_line(spotmorph("jobs", env={**os.environ, "SPOTMORPH_HOME": str(tmp_path)}))
    assert f"{files / 'fifo'}: not a regular file (a FIFO)" in line, line


def test_read_small_reads_a_file_up_to_its_bound_and_refuses_one_byte_more(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"x" * 16)
    assert read_small(path, "--token-file", 16) == b"x" * 16
    path.write_bytes(b"x" * 17)
    with pytest.raises(UserInputError, match=r"--token-file .*: larger than 16 bytes"):
        read_small(path, "--token-file", 16)
