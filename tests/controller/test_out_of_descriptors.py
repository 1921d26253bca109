"""Issue 44: a controller out of file descriptors says so (UNAVAILABLE, the cause and the fix), instead of
refusing SubmitJob with "profile cannot be read (OSError)" as if the user's file were at fault."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from controller.api.status import STATUS_OF_ERROR
from controller.shell.failures import OutOfDescriptors

EXHAUSTED = """
import os, resource, sys
from controller.shell.failures import OutOfDescriptors
from controller.shell.profiles import read_profile
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    read_profile(sys.argv[1])
except OutOfDescriptors as exc:
    print(exc)
"""


def test_a_profile_read_without_descriptors_left_is_the_controllers_trouble_not_the_users(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    result = subprocess.run(
        [sys.executable, "-c", EXHAUSTED, str(profile)], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.startswith("the controller has run out of file descriptors (EMFILE)"), result
    assert "LimitNOFILE" in result.stdout


def test_out_of_descriptors_is_unavailable() -> None:
    error = OutOfDescriptors("the job's profile", OSError(24, "Too many open files"))
    assert next(code for kind, code in STATUS_OF_ERROR if isinstance(error, kind)) == grpc.StatusCode.UNAVAILABLE
