"""Offline GCP: no test here may open a socket beyond loopback (tests/clouds.py); one signing key
for the tests that need no fake server (making an RSA key takes a while)."""

from __future__ import annotations

import pytest

from tests.clouds import loopback_only
from tests.gcp.fake_identity import FakeGoogle

__all__ = ["google", "loopback_only"]


@pytest.fixture(scope="session")
def google() -> FakeGoogle:
    return FakeGoogle()
