"""Offline AWS: moto's server, one a test worker, and no socket beyond loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.aws.fake_aws import MotoServer, moto_session
from tests.azure.conftest import loopback_only

__all__ = ["loopback_only", "moto_server"]


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    with moto_session() as server:
        yield server
