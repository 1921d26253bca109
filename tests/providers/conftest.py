"""The contract suite's fixtures: one factory a provider (see contract.py), and no socket beyond loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.aws.fake_aws import MotoServer, moto_server
from tests.clouds import loopback_only
from tests.providers.aws_subject import aws_factory
from tests.providers.azure_subject import azure_factory
from tests.providers.contract import Factory
from tests.providers.gcp_subject import gcp_factory

__all__ = ["aws_subject", "azure_subject", "gcp_subject", "loopback_only", "moto_server"]


@pytest.fixture
def azure_subject(tmp_path: Path) -> Factory:
    return azure_factory(tmp_path)


@pytest.fixture
def aws_subject(moto_server: MotoServer, tmp_path: Path) -> Factory:
    return aws_factory(moto_server, tmp_path)


@pytest.fixture
def gcp_subject() -> Factory:
    return gcp_factory()
